package atomicwriter

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"path"
	"syscall"
)

// fileMode is the mode f gets: its own bits, and group read with an
// fsGroup.
func (w *Writer) fileMode(f File) fs.FileMode {
	m := fs.FileMode(f.Mode).Perm()
	if w.fsGroup != nil {
		m |= groupRead
	}
	return m
}

// dirModeFor is the mode of the directories the writer makes.
func (w *Writer) dirModeFor() fs.FileMode {
	if w.fsGroup != nil {
		return dirMode | groupDirMask
	}
	return dirMode
}

// owner returns the uid and gid (-1: unchanged) a file with user fsUser
// gets.
func (w *Writer) owner(fsUser *int64) (uid, gid int) {
	uid, gid = -1, -1
	if fsUser != nil {
		uid = int(*fsUser)
	}
	if w.fsGroup != nil {
		gid = int(*w.fsGroup)
	}
	return uid, gid
}

// writeVersion writes payload in full into a new timestamped directory,
// with the modes and owners it needs, and returns its name. What it leaves
// on an error is not visible (nothing points to it) and goes with the next
// Write. Every file and directory is made new (O_EXCL, mkdirat) from a
// handle on the version's directory, and given its owner and mode on the
// descriptor that made it (directories: opened without following a link).
func (w *Writer) writeVersion(ctx context.Context, payload map[string]File, paths []string) (_ string, err error) {
	name, err := w.newVersion()
	if err != nil {
		return "", err
	}
	version := w.rel(name)
	defer func() {
		// A version that failed (a tmpfs out of space) was never
		// visible: it goes at once, so that it does not take the room
		// the next Write needs.
		if err != nil {
			_ = w.removeTree(version)
		}
	}()
	ver, err := w.root.Sub(version)
	if err != nil {
		return "", err
	}
	defer ver.Close()
	dirs := []string{"."}
	made := map[string]bool{}
	for _, p := range paths {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		if parent := path.Dir(p); parent != "." && !made[parent] {
			var missing []string
			for d := parent; d != "." && !made[d]; d = path.Dir(d) {
				missing = append(missing, d)
			}
			for i := len(missing) - 1; i >= 0; i-- {
				if err := ver.Mkdir(missing[i], dirMode); err != nil {
					return "", err
				}
				made[missing[i]] = true
				dirs = append(dirs, missing[i])
			}
		}
		f := payload[p]
		uid, gid := w.owner(f.FSUser)
		if err := ver.WriteFileNew(p, f.Data, w.fileMode(f), uid, gid); err != nil {
			return "", err
		}
	}
	_, gid := w.owner(nil)
	for _, d := range dirs {
		if err := ver.SetMode(d, w.dirModeFor(), -1, gid); err != nil {
			return "", err
		}
	}
	// The kubelet's ownership change covers the volume's directory too.
	if w.fsGroup != nil {
		if err := w.setGroupOfDir(); err != nil {
			return "", err
		}
	}
	return name, nil
}

// setGroupOfDir gives the volume's directory the fsGroup and the group
// bits, as the kubelet's ownership walk does, when it lacks them.
func (w *Writer) setGroupOfDir() error {
	d, err := w.root.OpenDir(w.dir)
	if err != nil {
		return err
	}
	defer d.Close()
	fi, err := d.Stat()
	if err != nil {
		return err
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	want := fi.Mode() | groupDirMask
	if st != nil && int64(st.Gid) == *w.fsGroup && fi.Mode() == want {
		return nil
	}
	if err := d.Chown(-1, int(*w.fsGroup)); err != nil {
		return err
	}
	return d.Chmod(want)
}

// holds reports whether timestamped directory name holds exactly payload:
// the same files (and no others), content, modes and owners, and the
// directories' modes.
func (w *Writer) holds(name string, payload map[string]File, paths []string) (bool, error) {
	found := map[string]fs.FileInfo{}
	ok, err := w.listVersion(w.rel(name), "", found)
	if err != nil || !ok || len(found) != len(paths) {
		return false, err
	}
	for _, p := range paths {
		fi, there := found[p]
		f := payload[p]
		uid, gid := w.owner(f.FSUser)
		if !there || fi.Mode() != w.fileMode(f) || !owned(fi, uid, gid) || fi.Size() != int64(len(f.Data)) {
			return false, nil
		}
		same, err := w.sameContent(path.Join(w.rel(name), p), f.Data)
		if err != nil || !same {
			return false, err
		}
	}
	return true, nil
}

// listVersion adds the regular files under directory rel (sub: its path in
// the version) to found, and reports false if it finds anything else, or
// a directory without the writer's mode and group.
func (w *Writer) listVersion(rel, sub string, found map[string]fs.FileInfo) (bool, error) {
	fi, err := w.root.Lstat(rel)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	_, gid := w.owner(nil)
	if !fi.IsDir() || fi.Mode().Perm()|fi.Mode()&fs.ModeSetgid != w.dirModeFor() || !owned(fi, -1, gid) {
		return false, nil
	}
	entries, err := w.root.ReadDir(rel)
	if err != nil {
		return false, err
	}
	for _, e := range entries {
		p := path.Join(sub, e.Name())
		switch {
		case e.IsDir():
			if ok, err := w.listVersion(path.Join(rel, e.Name()), p, found); err != nil || !ok {
				return false, err
			}
		case e.Type().IsRegular():
			info, err := e.Info()
			if err != nil {
				return false, err
			}
			found[p] = info
		default:
			return false, nil
		}
	}
	return true, nil
}

// owned reports whether fi has owner uid and group gid (-1: any).
func owned(fi fs.FileInfo, uid, gid int) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return uid == -1 && gid == -1
	}
	return (uid == -1 || int(st.Uid) == uid) && (gid == -1 || int(st.Gid) == gid)
}

// sameContent reports whether file rel holds data.
func (w *Writer) sameContent(rel string, data []byte) (bool, error) {
	f, err := w.root.Open(rel)
	if err != nil {
		return false, err
	}
	defer f.Close()
	got, err := io.ReadAll(io.LimitReader(f, int64(len(data))+1))
	if err != nil {
		return false, err
	}
	return bytes.Equal(got, data), nil
}

// switchTo makes ..data point to timestamped directory name, atomically:
// a link ..data_tmp to it, renamed over ..data. list is the directory's
// listing from before this Write.
func (w *Writer) switchTo(name string, list entries) error {
	tmp := w.rel(newDataDirName)
	if _, ok := list[newDataDirName]; ok {
		// An interrupted Write's.
		if err := w.root.RemoveAny(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if err := w.root.Symlink(name, tmp); err != nil {
		return err
	}
	if _, gid := w.owner(nil); gid != -1 {
		if err := w.root.Lchown(tmp, -1, gid); err != nil {
			return err
		}
	}
	// renameat replaces ..data, a link, and follows neither name.
	return w.root.Rename(tmp, w.rel(dataDirName))
}
