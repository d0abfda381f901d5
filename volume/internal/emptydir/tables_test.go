package emptydir

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"k8s.io/mount-utils"
)

// gatedLister is a mounter whose List waits for a value on gate, counts
// its reads and returns a table naming the read.
type gatedLister struct {
	mount.Interface
	gate    chan struct{}
	started chan int
	reads   atomic.Int32
}

func (g *gatedLister) List() ([]mount.MountPoint, error) {
	n := int(g.reads.Add(1))
	g.started <- n
	<-g.gate
	return []mount.MountPoint{{Path: "/read", Device: string(rune('0' + n))}}, nil
}

// TestTableReadsShared: calls made while a read of the mount table goes
// on share one later read, which begins after all of them: none gets the
// read that began before it.
func TestTableReadsShared(t *testing.T) {
	g := &gatedLister{Interface: mount.NewFakeMounter(nil), gate: make(chan struct{}), started: make(chan int, 10)}
	tables := &tableReads{}
	first := make(chan []mount.MountPoint)
	go func() {
		table, _ := tables.list(g)
		first <- table
	}()
	if n := <-g.started; n != 1 {
		t.Fatalf("read %d began, want 1", n)
	}
	// The first read is going on: these calls come after it began.
	const late = 5
	var wg sync.WaitGroup
	got := make([][]mount.MountPoint, late)
	for i := range late {
		wg.Go(func() {
			got[i], _ = tables.list(g)
		})
	}
	// Each late call joins the read waiting to begin, behind the first.
	for tables.waiting() < late {
		runtime.Gosched()
	}
	g.gate <- struct{}{} // the first read ends
	if table := <-first; table[0].Device != "1" {
		t.Errorf("the first call got read %s, want 1", table[0].Device)
	}
	close(g.gate) // every later read ends at once
	wg.Wait()
	for i, table := range got {
		if table[0].Device == "1" {
			t.Errorf("late call %d got the read that began before it", i)
		}
	}
	if n := g.reads.Load(); n != 2 {
		t.Errorf("%d reads for 1+%d calls, want 2", n, late)
	}
}

// waiting is how many calls wait for the read not begun yet.
func (t *tableReads) waiting() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.next == nil {
		return 0
	}
	return t.next.calls
}
