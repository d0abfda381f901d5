package kubelettest

import (
	"fmt"
	"os"
)

// Config is what varies in the KubeletConfiguration WriteConfig writes.
// Every field is required.
type Config struct {
	// RuntimeEndpoint is the container runtime's CRI endpoint
	// ("unix:///..."), for its runtime and image services.
	RuntimeEndpoint string
	// Port and HealthzPort are the kubelet's server and healthz ports
	// (FreePort): never the defaults, which a kubelet of the machine may
	// hold.
	Port, HealthzPort int
	// PodLogsDir is the containers' log directory.
	PodLogsDir string
}

// configTemplate is the configuration of a kubelet on this kind of
// machine: cgroup v1 allowed (the kubelet refuses it since 1.35 unless
// told), no cgroup hierarchy of its own (as the hollow node), no swap
// check, no resolv.conf, anonymous access to its own server; every period
// (sync, node status, lease, configMap and secret watches) is the default.
// Disk eviction and image garbage collection start only at 1% free: the
// default 15% for images is reached on a machine whose disk is busy with
// build caches, and a node under DiskPressure refuses the tests' pods
// ("Pod admission denied ... DiskPressure"), which says nothing about
// volumes; an image collected could not be pulled again either.
const configTemplate = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupsPerQOS: false
enforceNodeAllocatable: []
cgroupDriver: cgroupfs
failSwapOn: false
resolvConf: ""
containerRuntimeEndpoint: %[1]s
imageServiceEndpoint: %[1]s
port: %[2]d
healthzPort: %[3]d
readOnlyPort: 0
podLogsDir: %[4]s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%%
  nodefs.inodesFree: 1%%
  imagefs.available: 1%%
authentication:
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
`

// WriteConfig writes c as a KubeletConfiguration file at path.
func WriteConfig(path string, c Config) error {
	if c.RuntimeEndpoint == "" || c.Port == 0 || c.HealthzPort == 0 || c.PodLogsDir == "" {
		return fmt.Errorf("kubelet config %s: RuntimeEndpoint, Port, HealthzPort and PodLogsDir are required", path)
	}
	data := fmt.Sprintf(configTemplate, c.RuntimeEndpoint, c.Port, c.HealthzPort, c.PodLogsDir)
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		return fmt.Errorf("writing the kubelet config: %w", err)
	}
	return nil
}
