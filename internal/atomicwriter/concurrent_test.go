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
}

func (r *reader) readOnce() error {
	for _, name := range []string{"common", "nested/deep/f", "even"} {
		data, err := os.ReadFile(filepath.Join(r.dir, name))
		if name == "even" && errors.Is(err, fs.ErrNotExist) {
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

// snapshot reads two files of one version through ..data, opened once:
// they must be of the same generation.
func (r *reader) snapshot() error {
	d, err := os.Open(filepath.Join(r.dir, "..data"))
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
// newer one, or a file missing that every version has.
func TestConcurrentReader(t *testing.T) {
	root, dir := setup(t)
	w := newWriter(t, root, Options{})
	if _, err := w.Write(context.Background(), genPayload(0)); err != nil {
		t.Fatal(err)
	}
	const minWrites, minReads = 300, 1000
	var reads atomic.Int64
	done := make(chan struct{})
	readErr := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		r := &reader{dir: dir, last: map[string]int{}}
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
		changed, err := w.Write(context.Background(), genPayload(g))
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
	t.Logf("%d writes, %d reads", g, reads.Load())
}
