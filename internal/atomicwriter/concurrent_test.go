package atomicwriter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// content returns generation g's content of a file: large enough (several
// pages) that a reader racing a write in place sees a mix.
func content(g int) []byte {
	return bytes.Repeat(fmt.Appendf(nil, "generation %08d\n", g), 512)
}

// generation returns the generation of data, an error if data is not one
// generation's whole content.
func generation(data []byte) (int, error) {
	var g int
	if _, err := fmt.Sscanf(string(data), "generation %d\n", &g); err != nil {
		return 0, fmt.Errorf("not a generation's content (%d bytes): %w", len(data), err)
	}
	if !bytes.Equal(data, content(g)) {
		return 0, fmt.Errorf("a mix of versions or a partial file (%d bytes, starting as generation %d)", len(data), g)
	}
	return g, nil
}

func genPayload(g int) map[string]File {
	p := map[string]File{
		"common":        {Data: content(g), Mode: 0o644},
		"nested/deep/f": {Data: content(g), Mode: 0o600},
	}
	if g%2 == 0 {
		p["even"] = File{Data: content(g), Mode: 0o644}
	}
	return p
}

// reader reads the volume through its user-visible paths, and a snapshot
// through ..data, and fails on anything a reader must never see.
type reader struct {
	dir  string
	last map[string]int
	// begun and ended count the Writes that have begun and ended.
	begun, ended *atomic.Int64
	// spanned counts the reads that found a file missing because their
	// lookup spanned a whole Write.
	spanned int
}

func (r *reader) readOnce() error {
	for _, name := range []string{"common", "nested/deep/f", "even"} {
		ended := r.ended.Load()
		data, err := os.ReadFile(filepath.Join(r.dir, name))
		if name == "even" && errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if r.gone(err, ended) {
			continue
		}
		if err != nil {
			return fmt.Errorf("%s, in every version: %w", name, err)
		}
		g, err := generation(data)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if g < r.last[name] {
			return fmt.Errorf("%s: generation %d after %d", name, g, r.last[name])
		}
		r.last[name] = g
	}
	return r.snapshot()
}

// gone reports whether err is a lookup's ENOENT that the lookup may see
// because it spanned a whole Write, begun after ended Writes had ended, and
// counts it. The version the lookup resolved was current after Write
// number ended at the earliest, and Write ended+2 may have removed it. No
// writer keeps a version forever, so a lookup that a reader's thread
// spends descheduled across a whole Write (a busy machine, the race
// detector) may find it gone. One that spans less than that must find it:
// the version a Write replaces is kept until the next one.
func (r *reader) gone(err error, ended int64) bool {
	if !errors.Is(err, fs.ErrNotExist) || r.begun.Load() < ended+2 {
		return false
	}
	r.spanned++
	return true
}

// snapshot reads two files of one version through ..data, opened once:
// they must be of the same generation.
func (r *reader) snapshot() error {
	ended := r.ended.Load()
	d, err := os.Open(filepath.Join(r.dir, "..data"))
	if r.gone(err, ended) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("..data: %w", err)
	}
	defer d.Close()
	var gens []int
	for _, name := range []string{"common", "nested/deep/f"} {
		fd, err := unix.Openat(int(d.Fd()), name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) {
			return nil // the version was replaced and removed meanwhile
		}
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), name)
		var buf bytes.Buffer
		_, err = buf.ReadFrom(f)
		f.Close()
		if err != nil {
			return err
		}
		g, err := generation(buf.Bytes())
		if err != nil {
			return fmt.Errorf("..data/%s: %w", name, err)
		}
		gens = append(gens, g)
	}
	if gens[0] != gens[1] {
		return fmt.Errorf("one version through ..data holds generations %v", gens)
	}
	return nil
}

// TestConcurrentReader writes many versions while a reader reads: it never
// sees a mix of two versions, a partial file, an older version after a
// newer one, or a file missing that every version has, unless its lookup
// spanned a whole Write (reader.readOnce says why).
func TestConcurrentReader(t *testing.T) {
	root, dir := setup(t)
	w := newWriter(t, root, Options{})
	if _, err := w.Write(context.Background(), genPayload(0)); err != nil {
		t.Fatal(err)
	}
	const minWrites, minReads = 300, 1000
	var reads, begun, ended atomic.Int64
	r := &reader{dir: dir, last: map[string]int{}, begun: &begun, ended: &ended}
	done := make(chan struct{})
	readErr := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			if err := r.readOnce(); err != nil {
				readErr <- err
				return
			}
			reads.Add(1)
		}
	})
	g := 1
	for ; g <= minWrites || reads.Load() < minReads; g++ {
		begun.Add(1)
		changed, err := w.Write(context.Background(), genPayload(g))
		ended.Add(1)
		if err != nil || !changed {
			close(done)
			wg.Wait()
			t.Fatalf("write %d: %v, %v", g, changed, err)
		}
		select {
		case err := <-readErr:
			close(done)
			wg.Wait()
			t.Fatalf("after %d writes and %d reads: %v", g, reads.Load(), err)
		default:
		}
	}
	close(done)
	wg.Wait()
	select {
	case err := <-readErr:
		t.Fatalf("after %d writes and %d reads: %v", g, reads.Load(), err)
	default:
	}
	t.Logf("%d writes, %d reads, %d files missing to a lookup that spanned a whole Write", g, reads.Load(), r.spanned)
}
