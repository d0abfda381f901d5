package flexvolume

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"
	"k8s.io/utils/exec"

	"github.com/nodevol/nodevol/internal/fsgroup"
	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volume"
)

// DefaultPluginDir is the kubelet's default --volume-plugin-dir.
const DefaultPluginDir = "/usr/libexec/kubernetes/kubelet-plugins/volume/exec/"

// Secrets reads the Secret a volume's secretRef names. The volume manager
// reads it through its object cache.
type Secrets interface {
	Secret(ctx context.Context, namespace, name string) (*v1.Secret, error)
}

// Config configures the flexVolume drivers. Every field has the default
// its comment gives.
type Config struct {
	// PluginDir is the directory of drivers. Default DefaultPluginDir.
	// Unlike the kubelet, nodevol never creates it: while it is missing
	// there are no drivers, and its nearest existing parent is watched
	// for it to appear.
	PluginDir string
	// RootDir holds pods/ and plugins/, as the kubelet's root directory.
	// Default "/var/lib/kubelet". Below it no symlink is followed.
	RootDir string
	// NodeName is told to attach and detach.
	NodeName string
	// Node returns this node's Node, whose status.volumesAttached lists
	// the volumes the attach/detach controller attached. Default: none
	// (a driver that attaches can then only self-attach).
	Node func() (*v1.Node, error)
	// Mounter checks mount points and makes the default mounts. Default
	// mount.New("").
	Mounter mount.Interface
	// Exec runs the drivers (and mkfs for a default mountdevice). Default
	// exec.New().
	Exec exec.Interface
	// Secrets reads the secrets of volumes with a secretRef. Default:
	// none (a mount of such a volume fails).
	Secrets Secrets
	// InitTimeout bounds each driver's init. Default 1 minute (the
	// kubelet's has none: a hung init would hold the probe forever).
	InitTimeout time.Duration
	// WaitForAttachTimeout bounds waitforattach. Default 10 minutes, the
	// kubelet's.
	WaitForAttachTimeout time.Duration
	// EventRecorder, if set, gets the VolumePermissionChangeInProgress
	// events of a long ownership change. Default: none.
	EventRecorder record.EventRecorder
	// Steps, if set, sees every change under RootDir before it is made.
	Steps step.Hook
}

// Change is a driver found, changed or gone.
type Change struct {
	// Driver is the driver's name, "vendor/driver".
	Driver string
	// Plugin is the driver's volume plugin, initialised; nil when the
	// driver is gone or its probe failed (Err).
	Plugin volume.Plugin
	// Err says why a driver found could not be used (its init failed, its
	// name is invalid): it has no plugin until its directory changes again.
	Err error
}

// Drivers finds the flexVolume drivers of a directory and keeps them
// current (Run). It is a volume.Reconstructor for the volumes of the
// drivers found at start, and the volume.ObjectReader of every flexVolume
// pod volume.
type Drivers struct {
	host        *host
	dir         string
	initTimeout time.Duration
	started     chan struct{}

	mu sync.Mutex
	// known are the drivers in use, by directory name.
	known map[string]*driver
}

var (
	_ volume.Reconstructor = (*Drivers)(nil)
	_ volume.ObjectReader  = (*Drivers)(nil)
)

// New fills in cfg's defaults and returns the drivers of cfg.PluginDir;
// none is probed before Run.
func New(cfg Config) (*Drivers, error) {
	if cfg.PluginDir == "" {
		cfg.PluginDir = DefaultPluginDir
	}
	if cfg.RootDir == "" {
		cfg.RootDir = "/var/lib/kubelet"
	}
	rfs, err := rootfs.New(cfg.RootDir)
	if err != nil {
		return nil, fmt.Errorf("flexVolume plugin: Config.RootDir: %w", err)
	}
	rfs = rfs.WithSteps(cfg.Steps)
	if cfg.Mounter == nil {
		cfg.Mounter = mount.New("")
	}
	mounter := step.Mounter(cfg.Mounter, cfg.Steps)
	if cfg.Exec == nil {
		cfg.Exec = exec.New()
	}
	if cfg.InitTimeout <= 0 {
		cfg.InitTimeout = time.Minute
	}
	if cfg.WaitForAttachTimeout <= 0 {
		cfg.WaitForAttachTimeout = 10 * time.Minute
	}
	dir, err := filepath.Abs(cfg.PluginDir)
	if err != nil {
		return nil, fmt.Errorf("flexVolume plugin: Config.PluginDir: %w", err)
	}
	return &Drivers{
		host: &host{
			root: rfs.Path(), rfs: rfs, mounter: mounter, formatter: mount.NewSafeFormatAndMount(mounter, cfg.Exec),
			exec: cfg.Exec, secrets: cfg.Secrets, node: cfg.Node, nodeName: cfg.NodeName,
			ownership: fsgroup.Reporter{Events: cfg.EventRecorder}, waitTimeout: cfg.WaitForAttachTimeout,
		},
		dir:         dir,
		initTimeout: cfg.InitTimeout,
		started:     make(chan struct{}),
		known:       map[string]*driver{},
	}, nil
}

// Started is closed once Run has probed every driver present at start and
// apply has taken them in.
func (ds *Drivers) Started() <-chan struct{} { return ds.started }

// Run probes every driver of the directory, hands them to apply, then
// watches the directory and hands apply each driver that appears, changes
// (initialised again, a new plugin) or goes, until ctx ends. apply is
// called from Run's goroutine only.
func (ds *Drivers) Run(ctx context.Context, apply func([]Change)) {
	logger := klog.FromContext(ctx).WithValues("pluginDir", ds.dir)
	ctx = klog.NewContext(ctx, logger)
	w, err := fsnotify.NewWatcher()
	if err != nil {
		logger.Error(err, "Cannot watch the flexVolume driver directory: drivers are probed at start only")
	} else {
		defer w.Close()
	}
	watching := ds.watch(ctx, w)
	apply(ds.probeAll(ctx))
	close(ds.started)
	if w == nil {
		<-ctx.Done()
		return
	}
	for {
		pending := map[string]bool{}
		all := false
		select {
		case <-ctx.Done():
			return
		case err := <-w.Errors:
			logger.Error(err, "Watching the flexVolume driver directory")
			continue
		case ev := <-w.Events:
			all = ds.event(ctx, w, ev, pending, &watching)
		}
		for more := true; more; { // take in what came with it: a driver is written in several steps
			select {
			case ev := <-w.Events:
				all = ds.event(ctx, w, ev, pending, &watching) || all
			default:
				more = false
			}
		}
		var changes []Change
		if all {
			changes = ds.probeAll(ctx)
		} else {
			for _, name := range slices.Sorted(maps.Keys(pending)) {
				changes = append(changes, ds.probe(ctx, name)...)
			}
		}
		if len(changes) > 0 {
			apply(changes)
		}
	}
}

// watch watches the directory and its subdirectories, or, while it is
// missing, its nearest existing parent. It reports whether the directory
// itself is watched.
func (ds *Drivers) watch(ctx context.Context, w *fsnotify.Watcher) bool {
	if w == nil {
		return false
	}
	if _, err := os.Stat(ds.dir); err != nil {
		for p := filepath.Dir(ds.dir); ; p = filepath.Dir(p) {
			if _, err := os.Stat(p); err == nil {
				if err := w.Add(p); err != nil {
					klog.FromContext(ctx).Error(err, "Cannot watch for the flexVolume driver directory", "parent", p)
				}
				klog.FromContext(ctx).V(2).Info("The flexVolume driver directory does not exist: watching its parent for it", "parent", p)
				return false
			}
			if p == filepath.Dir(p) {
				return false
			}
		}
	}
	ds.watchTree(ctx, w, ds.dir)
	return true
}

// watchTree adds a watch on dir and every directory below it.
func (ds *Drivers) watchTree(ctx context.Context, w *fsnotify.Watcher, dir string) {
	_ = filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err == nil && e.IsDir() {
			if err := w.Add(path); err != nil {
				klog.FromContext(ctx).Error(err, "Cannot watch a flexVolume driver directory", "path", path)
			}
		}
		return nil
	})
}

// event takes in one fsnotify event: the driver directory it touched is
// added to pending; it reports whether every driver is to be probed again
// (the directory itself appeared or went).
func (ds *Drivers) event(ctx context.Context, w *fsnotify.Watcher, ev fsnotify.Event, pending map[string]bool, watching *bool) bool {
	if !*watching {
		// Waiting for the directory: any change of a parent may be it,
		// or a step down to it (a parent watched now instead).
		*watching = ds.watch(ctx, w)
		return *watching
	}
	if ev.Name == ds.dir {
		if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
			*watching = ds.watch(ctx, w)
			return true
		}
		return false
	}
	rel, err := filepath.Rel(ds.dir, ev.Name)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return false
	}
	first := strings.Split(rel, string(filepath.Separator))[0]
	if strings.HasPrefix(filepath.Base(ev.Name), ".") || strings.HasPrefix(first, ".") {
		return false
	}
	if ev.Has(fsnotify.Create) {
		if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
			ds.watchTree(ctx, w, ev.Name)
		}
	}
	pending[first] = true
	return false
}

// probeAll probes every driver directory, and reports the known drivers
// whose directory is gone.
func (ds *Drivers) probeAll(ctx context.Context) []Change {
	entries, err := os.ReadDir(ds.dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		klog.FromContext(ctx).Error(err, "Cannot read the flexVolume driver directory")
		return nil
	}
	seen := map[string]bool{}
	var changes []Change
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			seen[e.Name()] = true
			changes = append(changes, ds.probe(ctx, e.Name())...)
		}
	}
	ds.mu.Lock()
	var gone []string
	for name := range ds.known {
		if !seen[name] {
			gone = append(gone, name)
		}
	}
	ds.mu.Unlock()
	slices.Sort(gone)
	for _, name := range gone {
		changes = append(changes, ds.probe(ctx, name)...)
	}
	return changes
}

// probe initialises the driver of directory dirName again, or reports it
// gone when its executable is.
func (ds *Drivers) probe(ctx context.Context, dirName string) []Change {
	name := unescape(dirName)
	logger := klog.FromContext(ctx).WithValues("driver", name)
	exe := filepath.Join(ds.dir, dirName, name[strings.LastIndex(name, "/")+1:])
	ds.mu.Lock()
	_, wasKnown := ds.known[dirName]
	ds.mu.Unlock()
	if fi, err := os.Stat(exe); err != nil || fi.IsDir() {
		if !wasKnown {
			return nil
		}
		ds.forget(dirName)
		logger.Info("FlexVolume driver removed")
		return []Change{{Driver: name}}
	}
	d, err := ds.initDriver(ctx, name, dirName, exe)
	if err != nil {
		ds.forget(dirName)
		err = fmt.Errorf("error creating Flexvolume plugin from directory %s, skipping. Error: %w", dirName, err)
		logger.Error(err, "FlexVolume driver not usable")
		return []Change{{Driver: name, Err: err}}
	}
	ds.mu.Lock()
	ds.known[dirName] = d
	ds.mu.Unlock()
	logger.Info("FlexVolume driver initialised", "attach", d.caps.Attach, "fsGroup", d.caps.FSGroup, "supportsMetrics", d.caps.SupportsMetrics)
	return []Change{{Driver: name, Plugin: d}}
}

func (ds *Drivers) forget(dirName string) {
	ds.mu.Lock()
	delete(ds.known, dirName)
	ds.mu.Unlock()
}

// initDriver runs the driver's init and returns its plugin.
func (ds *Drivers) initDriver(ctx context.Context, name, dirName, exe string) (*driver, error) {
	if errs := validation.IsQualifiedName(name); len(errs) > 0 {
		return nil, fmt.Errorf("volume plugin has invalid name: %q: %s", name, strings.Join(errs, ";"))
	}
	d := &driver{host: ds.host, name: name, dirName: dirName, exe: exe, unsupported: map[string]bool{}}
	ctx, cancel := context.WithTimeout(ctx, ds.initTimeout)
	defer cancel()
	r, err := d.run(ctx, call{command: cmdInit})
	if err != nil {
		return nil, err
	}
	d.caps = *r.Caps
	return d, nil
}
