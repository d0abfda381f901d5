package agent

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nodevol/nodevol/volumemanager"
)

// TestClientRateLimit: the agent's API client runs at the kubelet's
// default rate (50 requests a second, 100 at once), not client-go's 5 and
// 10, which made 50 pods' service account tokens take 8 s; the flags
// change it.
func TestClientRateLimit(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args  []string
		qps   float32
		burst int
	}{
		{nil, 50, 100},
		{[]string{"--kube-api-qps=20", "--kube-api-burst=40"}, 20, 40},
	} {
		var o options
		if err := newFlagSet(&o).Parse(append([]string{"--kubeconfig=" + kubeconfig}, tc.args...)); err != nil {
			t.Fatal(err)
		}
		cfg, err := restConfig(o)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.QPS != tc.qps || cfg.Burst != tc.burst {
			t.Errorf("%v: QPS %v, burst %d; want %v, %d", tc.args, cfg.QPS, cfg.Burst, tc.qps, tc.burst)
		}
	}
}

// TestManagerConfigFromFlags: the flags that configure the volume manager
// reach its Config (a flag parsed and dropped is a silent no-op for the
// user).
func TestManagerConfigFromFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want volumemanager.Config
	}{
		{nil, volumemanager.Config{RootDir: "/var/lib/kubelet", PluginRegistration: true, ReportVolumesInUse: true, ShutdownGracePeriod: 20 * time.Second}},
		{
			[]string{"--volume-plugin-dir=/opt/flex", "--root-dir=/var/lib/nodevol", "--cluster-informers", "--self-attach", "--plugin-registration=false", "--report-volumes-in-use=false", "--shutdown-grace-period=5s"},
			volumemanager.Config{RootDir: "/var/lib/nodevol", VolumePluginDir: "/opt/flex", ClusterInformers: true, SelfAttach: true, ShutdownGracePeriod: 5 * time.Second},
		},
	} {
		var o options
		if err := newFlagSet(&o).Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		got := managerConfig(o, nil, nil, nil)
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%v: Config (-want +got):\n%s", tc.args, diff)
		}
	}
}
