package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodevol/nodevol/internal/roottest"
)

// TestDemo runs `make demo` (root): two pods with a volume of every kind
// mounted, used, deleted, unmounted and unstaged, their directories
// removed; runDemo fails if a mount, a loop device or a pod directory is
// left. A root of the test's own, so that what is left can be looked at.
func TestDemo(t *testing.T) {
	roottest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	root := filepath.Join(t.TempDir(), "root")
	if err := runDemo(ctx, options{pods: 2, node: "node-1", rootDir: root}); err != nil {
		t.Fatal(err)
	}
	pods, err := os.ReadDir(filepath.Join(root, "pods"))
	if err != nil && !os.IsNotExist(err) || len(pods) > 0 {
		t.Fatalf("pod directories left: %v, %v", pods, err)
	}
}
