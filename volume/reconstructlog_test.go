package volume_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/configmap"
	"github.com/nodevol/nodevol/volume/downwardapi"
	"github.com/nodevol/nodevol/volume/emptydir"
	"github.com/nodevol/nodevol/volume/projected"
	"github.com/nodevol/nodevol/volume/secret"
)

// projectedObjects, projectedTokens and objects stand for what the
// projected, configMap and secret plugins require; reconstruction calls
// none of them.
type (
	projectedObjects struct{ projected.Objects }
	projectedTokens  struct{ projected.Tokens }
	objects          struct{ configmap.Objects }
)

// TestReconstructLogsTheKind: the volumes found on disk at a restart are
// logged with their own kind, not as emptyDir volumes, for the kinds
// kept in a wrapped emptyDir (configMap, secret, downwardAPI, projected)
// as for emptyDir itself.
func TestReconstructLogsTheKind(t *testing.T) {
	for _, tc := range []struct {
		kind, dir string
		plugin    func(root string) (volume.Plugin, error)
	}{
		{"emptyDir", "kubernetes.io~empty-dir", func(root string) (volume.Plugin, error) {
			return emptydir.New(emptydir.Config{RootDir: root, Mounter: mount.NewFakeMounter(nil)})
		}},
		{"configMap", "kubernetes.io~configmap", func(root string) (volume.Plugin, error) {
			return configmap.New(configmap.Config{RootDir: root, Mounter: mount.NewFakeMounter(nil), Objects: objects{}})
		}},
		{"secret", "kubernetes.io~secret", func(root string) (volume.Plugin, error) {
			return secret.New(secret.Config{RootDir: root, Mounter: mount.NewFakeMounter(nil), Objects: objects{}})
		}},
		{"downwardAPI", "kubernetes.io~downward-api", func(root string) (volume.Plugin, error) {
			return downwardapi.New(downwardapi.Config{RootDir: root, Mounter: mount.NewFakeMounter(nil)})
		}},
		{"projected", "kubernetes.io~projected", func(root string) (volume.Plugin, error) {
			return projected.New(projected.Config{RootDir: root, Mounter: mount.NewFakeMounter(nil),
				Objects: projectedObjects{}, Tokens: projectedTokens{}})
		}},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			root := t.TempDir()
			p, err := tc.plugin(root)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(filepath.Join(root, "pods", "uid-1", "volumes", tc.dir, "vol"), 0o750); err != nil {
				t.Fatal(err)
			}
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(2), ktesting.BufferLogs(true)))
			found := p.(volume.Reconstructor).Reconstruct(klog.NewContext(context.Background(), logger), volume.Recovery{MountPoints: map[string]bool{}})
			if len(found.Mounts) != 1 {
				t.Fatalf("Reconstruct found %+v, want the one volume", found)
			}
			logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
			if !strings.Contains(logs, `Reconstructed volume kind="`+tc.kind+`"`) || tc.kind != "emptyDir" && strings.Contains(logs, "emptyDir") {
				t.Errorf("logs of the reconstruction:\n%s\nwant the volume named a %s volume", logs, tc.kind)
			}
		})
	}
}
