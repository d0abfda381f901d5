package resolve

import (
	"testing"

	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/podvol"
)

// TestNoCSIDriverSELinux: without a CSIDriver a CSI volume is not mounted
// with an SELinux context, as the kubelet decides (seLinuxMount false).
func TestNoCSIDriverSELinux(t *testing.T) {
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	other := csitest.CSIDriver("other.example.com", csitest.CSIDriverSpec{SELinuxMount: true})
	if err := indexer.Add(other); err != nil {
		t.Fatal(err)
	}
	r := &Resolver{CSIDrivers: storagelisters.NewCSIDriverLister(indexer)}
	for _, tt := range []struct {
		driver string
		want   bool
	}{{csitest.DefaultDriverName, false}, {"other.example.com", true}} {
		got, err := r.seLinuxSupport(&podvol.VolumeSpec{Driver: tt.driver})
		if err != nil || got != tt.want {
			t.Errorf("seLinuxSupport(%s) = %v, %v; want %v", tt.driver, got, err, tt.want)
		}
	}
}
