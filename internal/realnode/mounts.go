package realnode

import (
	"fmt"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"k8s.io/mount-utils"
)

// Mount is one line of /proc/self/mountinfo.
type Mount struct {
	// ID is the mount ID, Point the mount point, FSType the file system
	// type and Source the mount source (for example /dev/loop3).
	ID, Point, FSType, Source string
}

// MountsUnder returns the mounts at dir or below it, in mountinfo's order
// (a stacked mount after the one it covers), as the calling thread sees
// them: a thread locked in a mount namespace of its own sees that one's
// (/proc/self names the process's first thread).
func MountsUnder(dir string) ([]Mount, error) {
	infos, err := mount.ParseMountInfo("/proc/thread-self/mountinfo")
	if err != nil {
		return nil, err
	}
	dir = filepath.Clean(dir)
	var out []Mount
	for _, mi := range infos {
		// ParseMountInfo leaves mountinfo's escapes in the mount point.
		point := unescape(mi.MountPoint)
		if point == dir || strings.HasPrefix(point, dir+"/") {
			out = append(out, Mount{ID: strconv.Itoa(mi.ID), Point: point, FSType: mi.FsType, Source: mi.Source})
		}
	}
	return out, nil
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if c, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(c))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Unmount unmounts everything mounted at dir or below it, deepest first,
// in up to three rounds for stacked mounts (a kubelet bind-mounts its root directory onto itself;
// secret and projected volumes are tmpfs), lazily where a plain unmount
// fails, and says what is still mounted after that.
func Unmount(dir string) error {
	for range 3 {
		ms, err := MountsUnder(dir)
		if err != nil || len(ms) == 0 {
			return err
		}
		sort.SliceStable(ms, func(i, j int) bool { return len(ms[i].Point) > len(ms[j].Point) })
		for _, m := range ms {
			if err := syscall.Unmount(m.Point, 0); err != nil {
				_ = syscall.Unmount(m.Point, syscall.MNT_DETACH)
			}
		}
	}
	ms, err := MountsUnder(dir)
	if err != nil {
		return err
	}
	if len(ms) > 0 {
		return fmt.Errorf("mounts still under %s: %v", dir, ms)
	}
	return nil
}
