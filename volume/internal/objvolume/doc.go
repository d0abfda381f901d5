// Package objvolume is what the configMap and secret volume plugins share:
// a pod volume whose files are the keys of one API object, read from the
// node's object cache and written by the atomic writer into a wrapped
// emptyDir, as the kubelet's configmap and secret plugins do.
//
// A Kind says what differs between them: the plugin's name, the object's
// kind, how a pod volume's source names the object and its items, how the
// object becomes files, and whether the volume is a tmpfs (a secret) or a
// directory on disk (a configMap). Everything else is here:
//
//   - ResolveSpec checks what the pod spec gives (the object's name, the
//     item paths, the modes) and, for a tmpfs, stores its size, the
//     kubelet's for the wrapped emptyDir of medium Memory
//     (emptydir.Wrapper.MemorySize), in spec.Attributes["sizeBytes"];
//   - SetUp reads the object, builds the payload (items, defaultMode,
//     per-item modes, optional sources and keys), checks every path before
//     anything is made, sets the wrapped emptyDir up and writes the payload
//     with the pod's fsGroup; it runs again at each resync and after each
//     change of the object, and the writer changes nothing when nothing
//     changed;
//   - TearDown and Reconstruct are the Wrapper's, from the path alone.
package objvolume
