package atomicwriter

import (
	"errors"
	"io/fs"
	"maps"
	"path"
	"slices"
	"strings"
)

// linkTops makes the user-visible link of each top-level name of payload
// that has none: name -> ..data/name. What is there already under such a
// name is left as it is, as the kubelet leaves it (a link of the writer's
// points to ..data already; anything else is not the writer's). It reports
// whether it made a link. list is the directory's listing from before
// this Write, which made no such name.
func (w *Writer) linkTops(payload map[string]File, paths []string, list entries) (bool, error) {
	made := false
	for i, p := range paths {
		top := topLevel(p)
		if i > 0 && topLevel(paths[i-1]) == top {
			continue
		}
		if _, there := list[top]; there {
			continue
		}
		rel := w.rel(top)
		if err := w.root.Symlink(path.Join(dataDirName, top), rel); err != nil {
			return made, err
		}
		made = true
		if uid, gid := w.owner(payload[p].FSUser); uid != -1 || gid != -1 {
			if err := w.root.Lchown(rel, uid, gid); err != nil {
				return made, err
			}
		}
	}
	return made, nil
}

// pruneLinks removes the user-visible links of the names not in paths: a
// link is the writer's if its name does not start with ".." and it points
// to ..data/{its name}; nothing else is touched. It reports whether it
// removed one. list is the directory's listing from before this Write
// (the links it made are in paths).
func (w *Writer) pruneLinks(paths []string, list entries) (bool, error) {
	tops := make(map[string]bool, len(paths))
	for _, p := range paths {
		tops[topLevel(p)] = true
	}
	removed := false
	for _, name := range slices.Sorted(maps.Keys(list)) {
		if strings.HasPrefix(name, "..") || list[name]&fs.ModeSymlink == 0 || tops[name] {
			continue
		}
		target, err := w.root.Readlink(w.rel(name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return removed, err
		}
		if target != path.Join(dataDirName, name) {
			continue
		}
		if err := w.root.RemoveLink(w.rel(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return removed, err
		}
		removed = true
	}
	return removed, nil
}

// removeOld removes the timestamped directories other than current and
// keep (the version this Write replaced, if it replaced one), of those in
// list, the directory's listing from before this Write: older
// versions and those interrupted Writes left; and a leftover ..data_tmp.
//
// The version a Write replaces is kept until the next Write, where the
// kubelet removes it at once: a reader whose path lookup went through
// ..data just before the switch then finds the file it looks up in the
// version it resolved, rather than ENOENT for a file that every version
// has (TestTakeOver). Kept one Write longer, a reader sees that ENOENT
// only if its lookup spans a whole Write: on a busy machine a thread can be
// descheduled that long, and TestConcurrentReader allows exactly that.
func (w *Writer) removeOld(current, keep string, list entries) error {
	for _, name := range slices.Sorted(maps.Keys(list)) {
		typ := list[name]
		switch {
		case name == newDataDirName && typ&fs.ModeSymlink != 0:
			if err := w.root.RemoveLink(w.rel(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
		case name != current && name != keep && typ.IsDir() && isTimestampName(name):
			if err := w.removeTree(w.rel(name)); err != nil {
				return err
			}
		}
	}
	return nil
}

// removeTree removes directory rel and everything in it, following no
// symlink (one in it is removed itself).
func (w *Writer) removeTree(rel string) error {
	entries, err := w.root.ReadDir(rel)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	for _, e := range entries {
		child := path.Join(rel, e.Name())
		if e.IsDir() {
			err = w.removeTree(child)
		} else {
			err = w.root.RemoveAny(child)
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if err := w.root.Remove(rel); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
