package kubeletbench

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/kubernetes/pkg/kubelet/configmap"
	"k8s.io/kubernetes/pkg/kubelet/secret"
	"k8s.io/kubernetes/pkg/volume"
	"k8s.io/kubernetes/pkg/volume/csi"
	"k8s.io/kubernetes/pkg/volume/util/hostutil"
	"k8s.io/kubernetes/pkg/volume/util/subpath"
	"k8s.io/mount-utils"
)

// W6, real pods: the kubelet's side of nodevol's BenchmarkRealPods
// (volumemanager/bench_realpods_test.go), on the same objects. Each pod
// has a kube-api-access projected volume (a token, kube-root-ca.crt's
// ca.crt, the namespace), a configMap and a secret of its own, an emptyDir
// and a CSI claim. The kubelet's volume host is the hand-over tests'
// (newVolumeHost) on the benchmarks' fake mounter (internal/mapmount), with
// the kubelet's default secret and configMap managers (the Watch change
// detection strategy: a watch per object a registered pod references) and
// its token manager.

// syncFrequency is the kubelet's default syncFrequency, the resync period
// of its secret and configMap managers.
const syncFrequency = time.Minute

// workloadPlugins returns the kubelet's volume plugins for w on a
// newVolumeHost whose mounter is mounter (the volume manager's too, as in
// the kubelet) and whose host utilities are fakes. W1 to W5: the CSI plugin
// alone. W6: every plugin, with its secrets and configMaps from the
// kubelet's watching managers, which pm tells of its pods.
func workloadPlugins(ctx context.Context, w workload, root string, client *fake.Clientset, nodeObj *v1.Node, pm *podManager, mounter mount.Interface) (*volume.VolumePluginMgr, error) {
	c := hostConfig{root: root, client: client, node: nodeObj,
		mounter: mounter, hostUtil: hostutil.NewFakeHostUtil(nil), subpather: subpath.New(mounter)}
	if !w.real {
		c.plugins = csi.ProbeVolumePlugins()
	} else {
		secrets := secret.NewWatchingSecretManager(client, syncFrequency)
		configMaps := configmap.NewWatchingConfigMapManager(client, syncFrequency)
		pm.register = func(p *v1.Pod, present bool) {
			if present {
				secrets.RegisterPod(p)
				configMaps.RegisterPod(p)
			} else {
				secrets.UnregisterPod(p)
				configMaps.UnregisterPod(p)
			}
		}
		c.objects = &objectGetters{secret: secrets.GetSecret, configMap: configMaps.GetConfigMap}
	}
	host, err := newVolumeHost(ctx, &testing.T{}, c)
	if err != nil {
		return nil, fmt.Errorf("the kubelet's volume host in %s: %w", filepath.Base(root), err)
	}
	return host.pluginMgr, nil
}

// BenchmarkRealPods is W6 on the kubelet: W1 and W2 on real pods,
// NODEVOL_BENCH_W6_PODS (comma separated; 100, 1,000 and 5,000 unset).
func BenchmarkRealPods(b *testing.B) {
	for _, n := range benchSizesFrom("NODEVOL_BENCH_W6_PODS", 100, 1000, 5000) {
		b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) { report(b, workload{pods: n, real: true}) })
	}
}
