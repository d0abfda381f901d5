package emptydir

import (
	"bytes"
	"encoding/binary"

	"golang.org/x/sys/unix"
)

// dirent is a directory entry as getdents64 gives it: its name and its
// type (unix.DT_*; DT_UNKNOWN where the file system does not say).
type dirent struct {
	name string
	typ  byte
}

// readDir lists directory fd from its current offset, "." and ".."
// left out: the entries' types come with them, no stat each.
func readDir(fd int) ([]dirent, error) {
	var out []dirent
	buf := make([]byte, 8192)
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return out, nil
		}
		// struct linux_dirent64: d_ino u64, d_off s64, d_reclen u16,
		// d_type u8, d_name (NUL-terminated).
		for b := buf[:n]; len(b) >= 19; {
			reclen := int(binary.NativeEndian.Uint16(b[16:18]))
			if reclen < 19 || reclen > len(b) {
				break
			}
			name := b[19:reclen]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			if s := string(name); s != "." && s != ".." {
				out = append(out, dirent{name: s, typ: b[18]})
			}
			b = b[reclen:]
		}
	}
}
