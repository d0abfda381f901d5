package pluginmanager

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/fsnotify/fsnotify"
	"k8s.io/klog/v2"
)

// handleEvent updates the desired set from one fsnotify event.
func (m *Manager) handleEvent(ctx context.Context, ev fsnotify.Event) {
	logger := klog.FromContext(ctx)
	path := filepath.Clean(ev.Name)
	if ignoredName(path) || !m.inDir(path) {
		logger.V(5).Info("Ignoring file", "socketPath", path, "reason", "hidden or outside the directory")
		return
	}
	logger.V(5).Info("Plugin directory event", "socketPath", path, "op", ev.Op.String())
	if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
		m.removeDesired(path)
		if ev.Has(fsnotify.Rename) {
			_ = m.watcher.Remove(path) // a directory moved away; an error means it was none
		}
		return
	}
	if !ev.Has(fsnotify.Create) {
		return
	}
	fi, err := os.Lstat(path)
	if err != nil {
		// Gone again already; its Remove event follows.
		logger.V(4).Info("Ignoring file", "socketPath", path, "reason", err.Error())
		return
	}
	switch {
	case fi.IsDir():
		if err := m.walk(ctx, path, nil); err != nil {
			logger.Error(err, "Watching plugin subdirectory failed", "path", path)
		}
	case fi.Mode().Type() == fs.ModeSocket:
		m.addDesired(ctx, path, fi)
	default:
		logger.V(4).Info("Ignoring file", "socketPath", path, "reason", "not a unix socket")
	}
}

// ignoredName reports whether a path's name marks it as not a plugin: names
// starting with "." are ignored, as the kubelet does.
func ignoredName(path string) bool {
	return strings.HasPrefix(filepath.Base(path), ".")
}

func (m *Manager) inDir(path string) bool {
	return path == m.opts.Dir || strings.HasPrefix(path, m.opts.Dir+string(filepath.Separator))
}

// addDesired records socket path, with a new generation unless it is the
// same file already recorded.
func (m *Manager) addDesired(ctx context.Context, path string, fi os.FileInfo) {
	if d := m.desired[path]; d != nil && os.SameFile(d.file, fi) {
		return
	}
	m.nextGen++
	m.desired[path] = &desiredPlugin{gen: m.nextGen, file: fi, seen: m.opts.Clock.Now()}
	m.mu.Lock()
	m.sockets[path] = struct{}{}
	m.mu.Unlock()
	m.dirty[path] = struct{}{}
	klog.FromContext(ctx).V(4).Info("Plugin socket found", "socketPath", path, "generation", m.nextGen)
}

// removeDesired forgets path and, if it was a directory, every socket
// under it.
func (m *Manager) removeDesired(path string) {
	prefix := path + string(filepath.Separator)
	for p := range m.desired {
		if p == path || strings.HasPrefix(p, prefix) {
			delete(m.desired, p)
			m.mu.Lock()
			delete(m.sockets, p)
			m.mu.Unlock()
			m.dirty[p] = struct{}{}
		}
	}
}

// walk watches directory root and the directories under it and records the
// sockets it finds; found, when not nil, collects their paths.
func (m *Manager) walk(ctx context.Context, root string, found map[string]struct{}) error {
	logger := klog.FromContext(ctx)
	return filepath.WalkDir(root, func(path string, de fs.DirEntry, err error) error {
		if err != nil {
			if path == root {
				return err
			}
			logger.V(4).Info("Ignoring file", "socketPath", path, "reason", err.Error())
			return nil
		}
		if path != m.opts.Dir && ignoredName(path) {
			if de.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		switch {
		case de.IsDir():
			if err := m.watcher.Add(path); err != nil {
				if path == root {
					return fmt.Errorf("watching %s: %w", path, err)
				}
				logger.Error(err, "Watching plugin subdirectory failed", "path", path)
				return filepath.SkipDir
			}
		case de.Type() == fs.ModeSocket:
			fi, err := de.Info()
			if err != nil {
				return nil // gone meanwhile
			}
			m.addDesired(ctx, path, fi)
			if found != nil {
				found[path] = struct{}{}
			}
		}
		return nil
	})
}

// rescan makes the desired set match the directory: the safety net for
// lost events, and the initial scan. It creates the directory if missing.
func (m *Manager) rescan(ctx context.Context) error {
	if err := os.MkdirAll(m.opts.Dir, 0o750); err != nil {
		return fmt.Errorf("pluginmanager: creating %s: %w", m.opts.Dir, err)
	}
	found := map[string]struct{}{}
	if err := m.walk(ctx, m.opts.Dir, found); err != nil {
		return fmt.Errorf("pluginmanager: scanning %s: %w", m.opts.Dir, err)
	}
	for path := range m.desired {
		if _, ok := found[path]; !ok {
			m.removeDesired(path)
		}
	}
	return nil
}

func (m *Manager) rescanLogged(ctx context.Context) {
	if err := m.rescan(ctx); err != nil && !errors.Is(err, context.Canceled) {
		klog.FromContext(ctx).Error(err, "Rescanning plugin registration directory failed")
	}
}
