package resolve

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/internal/tokens"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/configmap"
	"github.com/nodevol/nodevol/volume/downwardapi"
	"github.com/nodevol/nodevol/volume/emptydir"
	"github.com/nodevol/nodevol/volume/hostpath"
	"github.com/nodevol/nodevol/volume/image"
	"github.com/nodevol/nodevol/volume/local"
	"github.com/nodevol/nodevol/volume/nfs"
	"github.com/nodevol/nodevol/volume/projected"
	"github.com/nodevol/nodevol/volume/secret"
)

// node is the node the tests' pods and CSI plugin run on.
const node = "node-1"

// The SELinux levels and the contexts they give (a pod's level only).
const (
	levelA   = "s0:c1,c2"
	contextA = "system_u:object_r:container_file_t:s0:c1,c2"
	levelB   = "s0:c3,c4"
)

// seLinuxPod is a pod mounting claim as volume "data", with the pod-level
// SELinux level (none when empty).
func seLinuxPod(name, claim, level string) *v1.Pod {
	pod := csitest.Pod("ns", name, csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: claim}}})
	if level != "" {
		pod.Spec.SecurityContext = &v1.PodSecurityContext{SELinuxOptions: &v1.SELinuxOptions{Level: level}}
	}
	return pod
}

// pluginsConfig is what the tests' built-in plugins are made from.
type pluginsConfig struct {
	RootDir string
	Mounter mount.Interface
}

// defaultPlugins are the plugins the volume manager registers besides CSI
// (its defaultPlugins), made as it makes them.
func defaultPlugins(cfg pluginsConfig, node func() (*v1.Node, error), objects *objectcache.Cache, toks *tokens.Cache, certs projected.PodCertificates) ([]volume.Plugin, error) {
	host, err := hostpath.New(hostpath.Config{})
	if err != nil {
		return nil, err
	}
	empty, err := emptydir.New(emptydir.Config{RootDir: cfg.RootDir, Mounter: cfg.Mounter, AllocatableMemory: AllocatableMemory(node)})
	if err != nil {
		return nil, err
	}
	loc, err := local.New(local.Config{RootDir: cfg.RootDir, Mounter: cfg.Mounter})
	if err != nil {
		return nil, err
	}
	cm, err := configmap.New(configmap.Config{RootDir: cfg.RootDir, Mounter: cfg.Mounter, AllocatableMemory: AllocatableMemory(node), Objects: objects})
	if err != nil {
		return nil, err
	}
	sec, err := secret.New(secret.Config{RootDir: cfg.RootDir, Mounter: cfg.Mounter, AllocatableMemory: AllocatableMemory(node), Objects: objects})
	if err != nil {
		return nil, err
	}
	down, err := downwardapi.New(downwardapi.Config{RootDir: cfg.RootDir, Mounter: cfg.Mounter, NodeAllocatable: NodeAllocatable(node)})
	if err != nil {
		return nil, err
	}
	proj, err := projected.New(projected.Config{RootDir: cfg.RootDir, Mounter: cfg.Mounter,
		AllocatableMemory: AllocatableMemory(node), NodeAllocatable: NodeAllocatable(node), Objects: objects, Tokens: toks, PodCertificates: certs})
	if err != nil {
		return nil, err
	}
	nf, err := nfs.New(nfs.Config{RootDir: cfg.RootDir, Mounter: cfg.Mounter})
	if err != nil {
		return nil, err
	}
	return []volume.Plugin{image.New(), host, empty, loc, nf, cm, sec, down, proj}, nil
}
