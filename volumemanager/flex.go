package volumemanager

import (
	"context"
	"fmt"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/volumemanager/internal/flexvolume"
)

// flexDrivers are the flexVolume drivers of Config.VolumePluginDir: each
// driver found is a plugin registered under its name in the manager's
// registry, replaced when the driver is initialised again and removed
// when it goes, as the kubelet's probed plugins are.
type flexDrivers struct {
	drivers *flexvolume.Drivers
	mu      sync.Mutex
	// names are the drivers registered now.
	names map[string]bool
}

func (vm *VolumeManager) newFlexDrivers() (*flexDrivers, error) {
	cfg := vm.cfg
	d, err := flexvolume.New(flexvolume.Config{
		PluginDir: cfg.VolumePluginDir, RootDir: cfg.RootDir, NodeName: cfg.NodeName, Node: vm.resolver.Node,
		Mounter: cfg.Mounter, Secrets: flexSecrets{vm.objects}, EventRecorder: cfg.EventRecorder, Steps: cfg.Steps,
	})
	if err != nil {
		return nil, err
	}
	return &flexDrivers{drivers: d, names: map[string]bool{}}, nil
}

// runFlex probes the drivers and keeps them current until ctx ends.
func (vm *VolumeManager) runFlex(ctx context.Context) {
	vm.flex.drivers.Run(ctx, func(changes []flexvolume.Change) { vm.applyFlex(ctx, changes) })
}

// applyFlex registers, replaces or removes the drivers' plugins, then has
// every pod resolved again (a pod volume of a driver that was missing
// resolves now) and the drivers' volumes tried again at once. A driver
// whose name is another plugin's is refused.
func (vm *VolumeManager) applyFlex(ctx context.Context, changes []flexvolume.Change) {
	logger := klog.FromContext(ctx)
	f := vm.flex
	f.mu.Lock()
	var changed []string
	for _, c := range changes {
		switch {
		case c.Plugin != nil && f.names[c.Driver]:
			if err := vm.volumes.Replace(c.Plugin); err != nil {
				logger.Error(err, "Cannot use the flexVolume driver", "driver", c.Driver)
				continue
			}
		case c.Plugin != nil:
			if err := vm.volumes.Register(c.Plugin); err != nil {
				logger.Error(err, "Cannot use the flexVolume driver", "driver", c.Driver)
				continue
			}
			f.names[c.Driver] = true
		case f.names[c.Driver]: // gone, or its init failed
			vm.volumes.Unregister(c.Driver)
			delete(f.names, c.Driver)
		default:
			continue
		}
		changed = append(changed, c.Driver)
	}
	f.mu.Unlock()
	if len(changed) > 0 {
		vm.in.PluginsChanged(changed...)
	}
}

// flexSecrets reads the secrets of flexVolumes through the node's object
// cache: the pod holds them (resolve.PodObjects, pvObjects).
type flexSecrets struct{ objects *objectcache.Cache }

func (s flexSecrets) Secret(ctx context.Context, namespace, name string) (*v1.Secret, error) {
	obj, err := s.objects.Get(ctx, objectcache.Ref{Kind: objectcache.Secret, Namespace: namespace, Name: name})
	if err != nil {
		return nil, err
	}
	sec, ok := obj.(*v1.Secret)
	if !ok {
		return nil, fmt.Errorf("secret %s/%s: read a %T", namespace, name, obj)
	}
	return sec, nil
}
