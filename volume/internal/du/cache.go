package du

import (
	"context"
	"sync"

	"github.com/nodevol/nodevol/volume"
)

// Cache keeps the first measurement of each volume that succeeded, until
// the volume is written again, as the kubelet's cached metrics do: the
// kubelet keeps the first answer of a volume's mounter that succeeded
// (NewCachedMetrics), and makes a new mounter, with an empty cache, at
// each set-up of the volume (every pod sync for these kinds). The figures
// are those of that measurement, statfs's included. A failed measurement
// is not kept. Safe for concurrent use; two first calls at once may both
// walk.
type Cache struct {
	mu sync.Mutex
	// stats are the measurements kept, by the volume's path.
	stats map[string]volume.Stats
	// gen counts the calls to Forget: a measurement that started before
	// one is not kept, since what it saw may be older than the write
	// that called Forget.
	gen uint64
}

// Stats returns the kept measurement of the volume at path, or measures it
// with Measure through root and keeps the result.
func (c *Cache) Stats(ctx context.Context, root Opener, path string) (volume.Stats, error) {
	c.mu.Lock()
	s, ok := c.stats[path]
	gen := c.gen
	c.mu.Unlock()
	if ok {
		return s, nil
	}
	s, err := Measure(ctx, root, path)
	if err != nil {
		return s, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen == gen {
		if c.stats == nil {
			c.stats = map[string]volume.Stats{}
		}
		c.stats[path] = s
	}
	return s, nil
}

// Forget drops the measurement of the volume at path: it was written (set
// up again) or torn down.
func (c *Cache) Forget(path string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.stats, path)
	c.gen++
}
