package wrapped

import (
	"errors"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/internal/emptydir"
)

// TestNew checks what New requires, and which of the node's figures bound
// the tmpfs.
func TestNew(t *testing.T) {
	fake := mount.NewFakeMounter(nil)
	node := func() (v1.ResourceList, error) {
		return v1.ResourceList{v1.ResourceMemory: resource.MustParse("1Gi")}, nil
	}
	mb := func() (int64, error) { return 1 << 20, nil }
	cases := []struct {
		name     string
		cfg      emptydir.Config
		node     func() (v1.ResourceList, error)
		wantErr  string
		size     int64
		notReady bool
	}{
		{name: "no root", cfg: emptydir.Config{Mounter: fake}, wantErr: "test plugin: RootDir is required"},
		{name: "no mounter", cfg: emptydir.Config{RootDir: t.TempDir()}, wantErr: "test plugin: Mounter is required"},
		{name: "no bound", cfg: emptydir.Config{RootDir: t.TempDir(), Mounter: fake}},
		{name: "the node's memory", cfg: emptydir.Config{RootDir: t.TempDir(), Mounter: fake}, node: node, size: 1 << 30},
		{name: "AllocatableMemory first", cfg: emptydir.Config{RootDir: t.TempDir(), Mounter: fake, AllocatableMemory: mb},
			node: node, size: 1 << 20},
		{name: "no memory on the node", cfg: emptydir.Config{RootDir: t.TempDir(), Mounter: fake},
			node: func() (v1.ResourceList, error) { return v1.ResourceList{}, nil }},
		// The Node not read yet: no tmpfs without its bound, as the
		// kubelet fails the mount when it cannot read its node.
		{name: "the node not read yet", cfg: emptydir.Config{RootDir: t.TempDir(), Mounter: fake},
			node: func() (v1.ResourceList, error) { return nil, errors.New("node not synced") }, notReady: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, err := New("test", "example.com/test", tc.cfg, tc.node)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("New: %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			got, err := b.Wrapper.MemorySize(&v1.Pod{})
			if got != tc.size || errors.Is(err, volume.ErrNotReady) != tc.notReady {
				t.Errorf("MemorySize: %d, %v; want %d, not ready %v", got, err, tc.size, tc.notReady)
			}
		})
	}
}

// TestNodeAllocatable checks that the node is read only for an item that
// needs it, and that a node not read is not the pod's fault.
func TestNodeAllocatable(t *testing.T) {
	limit := []v1.DownwardAPIVolumeFile{{Path: "cpu", ResourceFieldRef: &v1.ResourceFieldSelector{Resource: "limits.cpu"}}}
	name := []v1.DownwardAPIVolumeFile{{Path: "name", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}}}
	cpu := v1.ResourceList{v1.ResourceCPU: resource.MustParse("4")}
	cases := []struct {
		name     string
		node     func() (v1.ResourceList, error)
		items    []v1.DownwardAPIVolumeFile
		want     v1.ResourceList
		notReady bool
	}{
		{name: "a limit", node: func() (v1.ResourceList, error) { return cpu, nil }, items: limit, want: cpu},
		{name: "no limit read", node: func() (v1.ResourceList, error) { return nil, errors.New("not asked") }, items: name},
		{name: "no node known", items: limit},
		{name: "the node not read", node: func() (v1.ResourceList, error) { return nil, errors.New("no node yet") },
			items: limit, notReady: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, err := New("test", "example.com/test", emptydir.Config{RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil)}, tc.node)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			got, err := b.NodeAllocatable(tc.items)
			if tc.notReady {
				if !errors.Is(err, volume.ErrNotReady) || !strings.HasPrefix(err.Error(), "error retrieving node: no node yet") {
					t.Errorf("NodeAllocatable: %v, want the node's error wrapping ErrNotReady", err)
				}
				return
			}
			if err != nil || !got.Cpu().Equal(*tc.want.Cpu()) {
				t.Errorf("NodeAllocatable: %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}
