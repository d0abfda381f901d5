// Package objectcache is the node's one cache of the API objects its pods'
// volumes read (configMaps, secrets, ClusterTrustBundles, and, where the
// node reads them itself, PersistentVolumeClaims, PersistentVolumes and
// VolumeAttachments): the configMap, secret and projected plugins and the
// volume manager read them through it, and learn through OnChange when
// one changes, so that a pod's files follow within one watch event.
//
// A holder (a pod UID) holds Refs; the cache keeps one entry per Ref
// however many holders hold it, reads it while it is held and drops it,
// stopping its read, when the last holder lets go. A Ref names one object
// or selects the objects of a kind by fields and labels (the
// ClusterTrustBundles of a signer, for a projected volume).
//
// This is the kubelet's watch-based secret and configMap managers
// (pkg/kubelet/util/manager) reshaped for nodevol:
//
//   - ModeWatch (the default): per entry, one watch-list request (a watch
//     with sendInitialEvents=true that streams the object first, then its
//     changes) with the field selector metadata.name=NAME in the object's
//     namespace (what the Node authorizer allows a node for the objects
//     its pods use), as the kubelet's reflectors make since client-go
//     1.35; the watch is resumed from its last resourceVersion, read
//     afresh the same way when that version is gone, and retried with
//     internal/backoff's policy when it fails. Where the API server
//     refuses or ignores watch-list requests (or the client cannot make
//     them: the fake clientset, or client-go's WatchListClient feature
//     off), a list and then a watch instead, remembered for the cache. ModeGet reads each entry again every TTL instead (a
//     GET, served from the API server's cache after the first), for
//     clusters that do not let the node watch.
//   - A kind the Node authorizer lets a node GET but not list or watch
//     (claims, volumes, VolumeAttachments) is read in ModeGet whatever
//     the Mode, by name only; a VolumeAttachment missing or not attached
//     yet is read again after 1 s, then half as long again each time up
//     to 10 s, as the kubelet polls it while waiting for the attach. A
//     PersistentVolume, once found, is read again only when cued: when
//     the claim bound to it changes (the resizer grows a volume and then
//     marks its claim; the binder sets a volume's claimRef and then binds
//     the claim), or when a new holder holds it a TTL or more after its
//     last read, not every TTL (a missing one is read every TTL).
//     Config.TTLJitter spreads the TTL's reads.
//   - A watched entry keeps its watch on a goroutine of its own for as
//     long as it is held. A ModeGet entry holds no goroutine between its
//     reads: its next read is a timer on Config.Clock (AfterFunc; a clock
//     without it costs a goroutine per waiting entry), whose callback
//     starts the read on a goroutine that ends with it, so that thousands
//     of held claims, volumes and attachments cost a timer each, not a
//     parked stack. An entry's reads never overlap; dropping the entry, or
//     the end of Run's context, stops its timer and cancels a read in
//     flight (whose answer is then not kept), and Run returns once every
//     read it started has ended.
//   - An immutable configMap or secret (immutable: true) is kept once read
//     and no longer watched or read, as the kubelet does.
//   - Get waits, bounded by its context, for the first answer of the
//     entry's read; a read the node may not make is returned as the API
//     server's error (apierrors.IsForbidden), a missing object as
//     apierrors.IsNotFound, and a kind whose API the server does not
//     serve (the server's own 404, which is IsNotFound too) as an error
//     wrapping ErrNotServed that is not IsNotFound, retried as any
//     failed read. After a good answer, a failing read keeps the
//     last known object. Peek answers as Get without waiting, for a
//     reader that must not block: before the first answer it says so
//     (ErrNotAnswered), and that answer is then announced through
//     OnChange.
//
// Unlike the kubelet, the cache is told what each holder holds (Hold
// replaces a holder's set) rather than reading pods; it stops an
// immutable object's watch on the event that makes it immutable rather
// than on the next Get; it has no idle-watch recycling (an entry is read
// while held, and dropped with its last holder, which the kubelet also
// does); and it announces changes (OnChange) instead of leaving them to
// be found by a periodic resync. The kubelet reads ClusterTrustBundles
// through one informer on all of them; the cache reads only the ones the
// pods select, each selection with a field selector on spec.signerName
// and the label selector sent to the API server.
package objectcache
