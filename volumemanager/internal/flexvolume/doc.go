// Package flexvolume is the volume plugin of flexVolume pod volumes and
// PersistentVolumes (spec.flexVolume): volumes set up by a driver, an
// executable the node runs with a command and JSON options, as the kubelet
// v1.37's flexvolume plugin runs it, on the kubelet's layout.
//
// Drivers are found as the kubelet finds them: each directory
// {dir}/{vendor~driver} of the plugin directory (the kubelet's
// --volume-plugin-dir, DefaultPluginDir) holding an executable named
// {driver} is the driver "vendor/driver". Drivers.Run calls each one's
// init once, takes the capabilities of its reply (attach, selinuxRelabel,
// supportsMetrics, fsGroup, requiresFSResize; each defaults to the
// kubelet's default when the reply leaves it out) and hands one volume
// plugin per driver, named after the driver, to its caller; then it
// watches the directory (fsnotify) and probes again every driver
// directory that changed: a new or changed driver is initialised again
// (its plugin replaced), a removed one goes.
//
// The call protocol is the kubelet's: `{driver} {command} {args...}`
// with one JSON object of options (kubernetes.io/fsType,
// kubernetes.io/readwrite, kubernetes.io/pvOrVolumeName, for a mount the
// pod's name, namespace, UID and service account, its fsGroup
// (kubernetes.io/mounterArgs.FsGroup) and each key of the volume's
// secretRef as kubernetes.io/secret/{key}, base64; then the source's
// options), answered by a JSON reply whose status is Success, Failure or
// "Not supported". A command a driver does not support is remembered and
// not called again until the driver is initialised again, and the
// kubelet's default takes its place: a mount not supported bind-mounts
// the device mount; an unmount not supported unmounts and removes the
// directory; waitforattach not supported keeps the attach's device path;
// mountdevice not supported formats and mounts the device when there is
// one.
//
// Volumes:
//
//   - a pod volume is set up at {root}/pods/{uid}/volumes/{vendor~driver}/{name}
//     ({name} the pod's volume name, or the PV's) with `mount {dir} {json}`
//     and torn down with `unmount {dir}`; the directory is removed after;
//   - a driver whose init says attach: true has its volumes attached and
//     staged: the node waits for the attach/detach controller to list the
//     volume in the Node's status.volumesAttached (Attacher) and calls
//     `waitforattach {devicePath} {json}`, or (self-attach mode) calls
//     `attach {json} {node}` itself (SelfAttacher) and `detach {volume}
//     {node}` after the last unstage; it stages with `mountdevice
//     {deviceMountPath} {devicePath} {json}` at
//     {root}/plugins/kubernetes.io/flexvolume/{vendor/driver}/mounts/{name}
//     and unstages with `unmountdevice {deviceMountPath}`;
//   - unique names are the kubelet's: {vendor/driver}/{podUID}-{name} for a
//     driver that does not attach, {vendor/driver}/{name} for one that does;
//   - after a restart Reconstruct finds the pod directories and device
//     mounts of the drivers known at start.
//
// Secrets are read through the Secrets the caller gives (the volume
// manager's object cache); their values are never logged. A secret must be
// of type {vendor/driver}, as the kubelet requires.
package flexvolume
