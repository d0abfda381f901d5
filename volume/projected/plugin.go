// Package projected is the volume plugin of projected pod volumes
// ("kubernetes.io/projected"): the files of several sources (configMaps,
// secrets, the downward API, a service account token, ClusterTrustBundles,
// a pod certificate) in one directory on a tmpfs, kept current. Every pod
// the API server admits has one: kube-api-access-*, a token, the cluster's
// CA from the configMap kube-root-ca.crt and the pod's namespace.
//
// It does what the kubelet v1.37's projected plugin does, on the kubelet's
// layout, so that a node can pass between the kubelet and nodevol:
//
//   - the volume is a tmpfs at {root}/pods/{uid}/volumes/kubernetes.io~projected/{name},
//     a wrapped emptyDir of medium Memory (the ready file of an emptyDir
//     named wrapped_{name}, emptydir.Wrapper) sized as the kubelet sizes it
//     (the pod's memory limit, the node's allocatable memory), written by
//     the atomic writer (internal/atomicwriter: ..data and the timestamped
//     directories, the pod's fsGroup given to every file whatever the
//     planner's ChangeOwnership, as the kubelet always applies it here);
//   - configMap and secret sources: their keys, or their items, with the
//     volume's defaultMode and the items' modes; an optional source whose
//     object is missing adds nothing, an optional item whose key is missing
//     is skipped; a missing object or key of a source that is not optional
//     is the kubelet's error (`configmap "x" not found`, `configmap
//     references non-existent config key: k`), retried;
//   - downwardAPI sources: the files of the kubelet's CollectData
//     (internal/downward), computed by ResolveSpec from the pod;
//   - a serviceAccountToken source: a token of the pod's service account
//     ("default" when the pod names none) from a TokenRequest with the
//     source's audience (none: the API server's default audiences) and
//     expirationSeconds (3600 when unset), bound to the pod (kind Pod, its
//     name and UID); the token is the one the token cache handed out until
//     it is due for a refresh (internal/tokens);
//   - a clusterTrustBundle source: the bundle by name, or the bundles of a
//     signer that the label selector selects (no selector selects none), as
//     one PEM file of CERTIFICATE blocks, each certificate once; optional:
//     a bundle or a selection that is missing is an empty file; the
//     kubelet's errors otherwise (`combination of signerName and
//     labelSelector matched zero ClusterTrustBundles`);
//   - a podCertificate source: the key and the certificate chain the pod
//     certificate manager (Config.PodCertificates) holds for the source, in
//     the credential bundle (key then chain), key and chain files it names;
//   - a token, trust bundle or certificate file has the volume's
//     defaultMode, or 0600 when its owner is set (the one runAsUser every
//     container of the pod runs as: FSUser) or the pod has an fsGroup (then
//     0640); the files of such an owner are owned by it;
//   - paths that the API server refuses as "conflicting duplicate paths"
//     (two items, bundle or certificate paths of the same spelling) are
//     refused by ResolveSpec; a path that two sources give at run time (a
//     configMap key without items, a token path) is the later source's
//     file, as in the kubelet;
//   - every source's error is reported (aggregated as the kubelet
//     aggregates them), and nothing is written when one fails;
//   - SetUp runs again at each resync and after a change of an object the
//     volume reads (Republish), and changes nothing when the files are the
//     same; TearDown and Reconstruct are the wrapped emptyDir's, from the
//     path alone.
//
// ResolveSpec stores in spec.Attributes, read by this plugin only:
// "resolved" ("true"); "sizeBytes", the tmpfs size in bytes ("0":
// unbounded); "fsUser", the pod's FSUser (decimal) when it has one; and
// per file of a downwardAPI source i, "file:{i}:{path}" whose value is
// "{mode in octal}:{owner's UID or nothing}:{content}".
//
// Beyond the kubelet, a failed update leaves the old files in place (the
// kubelet tears the volume down when its write fails), and the certificates
// of a trust bundle are written in a stable order (sorted by their DER
// bytes): the kubelet shuffles them each time it reads the bundles again,
// about every 5 minutes, which rewrites the file with nothing changed.
//
// What the kubelet does and this plugin does not: the directories of nested
// mount points (MakeNestedMountpoints); handing out a token it still holds
// when a refresh fails (the token cache's job: here the SetUp fails and the
// old token stays in the file); forgetting the pod's tokens at TearDown
// (the volume manager's, when the pod is gone).
//
// Usage (VolumeStats) is the kubelet's: a du walk of the tmpfs, kept until
// the volume is written again (at each resync, each change of a source and
// each token refresh).
package projected

import (
	"context"
	"errors"
	"fmt"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/internal/emptydir"
	"github.com/nodevol/nodevol/volume/internal/wrapped"
)

// PluginName is the plugin's name, the kubelet's.
const PluginName = "kubernetes.io/projected"

// Objects is what the plugin reads configMaps, secrets and
// ClusterTrustBundles from: the node's object cache (objectcache.Cache),
// whose Get answers apierrors.IsNotFound for a missing object and whose
// List returns what a selecting Ref holds.
type Objects interface {
	Get(ctx context.Context, ref objectcache.Ref) (runtime.Object, error)
	List(ctx context.Context, ref objectcache.Ref) ([]runtime.Object, error)
}

// Tokens issues service account tokens (tokens.Cache): the token issued
// earlier for the same request while it is not due for a refresh.
type Tokens interface {
	ServiceAccountToken(ctx context.Context, namespace, name string, tr *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, time.Time, error)
}

// PodCertificates holds the pod certificates of the node's pods (the
// kubelet's pod certificate manager): the private key and the certificate
// chain (both PEM) of source sourceIndex of projected volume volume of pod.
type PodCertificates interface {
	Credentials(ctx context.Context, pod podvol.PodRef, volume string, sourceIndex int, src *v1.PodCertificateProjection) (key, chain []byte, err error)
}

// Config configures the plugin.
type Config struct {
	// RootDir is the kubelet's root directory (/var/lib/kubelet): pods/
	// lives under it. Required.
	RootDir string
	// Mounter mounts and unmounts the volumes' tmpfs and lists the mount
	// table. Required (mount.NewFakeMounter in unit tests).
	Mounter mount.Interface
	// Steps, if set, sees every change the plugin makes to the node
	// (directories, files, links, mounts) before it is made (package
	// step). Default: none.
	Steps step.Hook
	// AllocatableMemory returns the node's allocatable memory in bytes:
	// an upper bound of a volume's tmpfs. Nil: the memory of
	// NodeAllocatable. An error or a figure that is not positive: not used
	// as a bound.
	AllocatableMemory func() (int64, error)
	// NodeAllocatable returns the node's allocatable resources: the limits
	// of cpu, memory and ephemeral-storage of a container that declares
	// none, which a downwardAPI item may read. It is called when a pod is
	// resolved. Nil: such a limit reads 0. An error fails the resolution of
	// a pod with such an item, wrapping volume.ErrNotReady.
	NodeAllocatable func() (v1.ResourceList, error)
	// Objects reads configMaps, secrets and ClusterTrustBundles; the
	// caller holds the Refs of each pod's volumes (Refs) before they are
	// set up. Required.
	Objects Objects
	// Tokens issues the serviceAccountToken sources' tokens. Required.
	Tokens Tokens
	// PodCertificates gives the podCertificate sources' keys and chains.
	// Nil: a volume with a podCertificate source fails to set up, with an
	// error that says so.
	PodCertificates PodCertificates
	// UserFields turns on the user fields (defaultUser, items[].user,
	// the sources' user) of the AtomicWriteVolumeUserFields feature
	// (alpha in 1.37, off by default, as in the kubelet).
	UserFields bool
}

// plugin is the projected plugin; the wrapped emptyDir gives it its
// Capabilities, TearDown, Reconstruct, Retake and VolumeStats.
type plugin struct {
	wrapped.Base
	objects    Objects
	tokens     Tokens
	certs      PodCertificates
	userFields bool
}

var (
	_ volume.Plugin        = (*plugin)(nil)
	_ volume.SpecResolver  = (*plugin)(nil)
	_ volume.Reconstructor = (*plugin)(nil)
	_ volume.StatsProvider = (*plugin)(nil)
	_ volume.ObjectReader  = (*plugin)(nil)
)

// New returns the projected plugin; it implements volume.SpecResolver and
// volume.Reconstructor too.
func New(cfg Config) (volume.Plugin, error) {
	return newPlugin(cfg)
}

func newPlugin(cfg Config) (*plugin, error) {
	b, err := wrapped.New("projected", PluginName, emptydir.Config{RootDir: cfg.RootDir, Mounter: cfg.Mounter, Steps: cfg.Steps,
		AllocatableMemory: cfg.AllocatableMemory}, cfg.NodeAllocatable)
	switch {
	case err != nil:
		return nil, err
	case cfg.Objects == nil:
		return nil, errors.New("projected plugin: Objects is required")
	case cfg.Tokens == nil:
		return nil, errors.New("projected plugin: Tokens is required")
	}
	return &plugin{Base: b, objects: cfg.Objects, tokens: cfg.Tokens, certs: cfg.PodCertificates, userFields: cfg.UserFields}, nil
}

// Name implements volume.Plugin.
func (p *plugin) Name() string { return PluginName }

// CanSupport implements volume.Plugin: pod volumes with a projected source.
func (p *plugin) CanSupport(v *v1.Volume) bool { return v != nil && v.Projected != nil }

// Objects implements volume.ObjectReader: what a projected pod volume
// reads (Refs).
func (p *plugin) Objects(namespace string, v *v1.Volume) []objectcache.Ref {
	return refs(namespace, v.Projected)
}

// refs returns the objects a projected volume of a pod in namespace ns
// reads, for the volume manager to hold in the object cache: the
// configMaps and secrets of its sources (optional or not: one that appears
// later fills the volume) and its ClusterTrustBundles, by name or as the
// selection of a signer's bundles by labels (spec.signerName=... and the
// label selector's String). A selection with no label selector selects
// nothing (the kubelet's rule) and needs no Ref; nor does one whose
// selector is invalid (ResolveSpec refuses it). None for a nil source.
func refs(ns string, src *v1.ProjectedVolumeSource) []objectcache.Ref {
	if src == nil {
		return nil
	}
	var out []objectcache.Ref
	for _, s := range src.Sources {
		switch {
		case s.ConfigMap != nil && s.ConfigMap.Name != "":
			out = append(out, objectcache.Ref{Kind: objectcache.ConfigMap, Namespace: ns, Name: s.ConfigMap.Name})
		case s.Secret != nil && s.Secret.Name != "":
			out = append(out, objectcache.Ref{Kind: objectcache.Secret, Namespace: ns, Name: s.Secret.Name})
		case s.ClusterTrustBundle != nil:
			if r, ok, err := trustBundleRef(s.ClusterTrustBundle); ok && err == nil {
				out = append(out, r)
			}
		}
	}
	return out
}

// trustBundleRef is the object cache's Ref of a clusterTrustBundle source:
// the bundle by name, or the selection of a signer's bundles. ok is false
// for a selection that selects nothing (no label selector) or a source
// that names neither; err is a label selector's error, the kubelet's text.
func trustBundleRef(src *v1.ClusterTrustBundleProjection) (ref objectcache.Ref, ok bool, err error) {
	switch {
	case src.Name != nil:
		return objectcache.Ref{Kind: objectcache.ClusterTrustBundle, Name: *src.Name}, true, nil
	case src.SignerName == nil || src.LabelSelector == nil:
		return objectcache.Ref{}, false, nil
	}
	sel, err := metav1.LabelSelectorAsSelector(src.LabelSelector)
	if err != nil {
		return objectcache.Ref{}, false, fmt.Errorf("while parsing label selector: %w", err)
	}
	return objectcache.Ref{Kind: objectcache.ClusterTrustBundle,
		Fields: fields.OneTermEqualSelector("spec.signerName", *src.SignerName).String(), Labels: sel.String()}, true, nil
}
