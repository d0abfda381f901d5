package projected

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/internal/objvolume/objtest"
)

// TestResolveSpecErrors: what the API server would refuse is refused when
// the pod is resolved, naming the pod, the volume, the source and the
// cause.
func TestResolveSpecErrors(t *testing.T) {
	signer := "example.com/s"
	fieldItem := func(p, field string) v1.VolumeProjection {
		return v1.VolumeProjection{DownwardAPI: &v1.DownwardAPIProjection{Items: []v1.DownwardAPIVolumeFile{{Path: p, FieldRef: &v1.ObjectFieldSelector{FieldPath: field}}}}}
	}
	for _, tc := range []struct {
		name    string
		src     v1.ProjectedVolumeSource
		wantErr string
	}{{
		name:    "two items of two sources at one path",
		src:     v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{cmSource("c", false, v1.KeyToPath{Key: "a", Path: "p"}), fieldItem("p", "metadata.name")}},
		wantErr: "sources[1]: path p: conflicting duplicate paths",
	}, {
		name:    "a path that is a directory of another",
		src:     v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{tokenSource("t"), fieldItem("t/x", "metadata.name")}},
		wantErr: "path t is a file and a directory of path t/x",
	}, {
		name:    "two kinds in one source",
		src:     v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{{ConfigMap: &v1.ConfigMapProjection{}, Secret: &v1.SecretProjection{}}}},
		wantErr: "sources[0]: may not specify more than 1 volume type per source",
	}, {
		name:    "a path leaving the volume",
		src:     v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{tokenSource("../t")}},
		wantErr: `sources[0]: path "../t": invalid path: must not contain '..'`,
	}, {
		name:    "a defaultMode out of range",
		src:     v1.ProjectedVolumeSource{DefaultMode: ptr[int32](0o1777), Sources: []v1.VolumeProjection{tokenSource("t")}},
		wantErr: "defaultMode 01777: must be between 0 and 0777",
	}, {
		name:    "a configMap with no name",
		src:     v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{cmSource("", false)}},
		wantErr: "sources[0]: configMap: the source names no configMap",
	}, {
		name: "a token of less than 10 minutes",
		src: v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{{ServiceAccountToken: &v1.ServiceAccountTokenProjection{
			Path: "t", ExpirationSeconds: ptr[int64](60)}}}},
		wantErr: "expirationSeconds 60: must be between 10 minutes",
	}, {
		name: "a trust bundle by name and signer",
		src: v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{{ClusterTrustBundle: &v1.ClusterTrustBundleProjection{
			Name: ptr("b"), SignerName: &signer, Path: "ca"}}}},
		wantErr: "only one of name and signerName may be used",
	}, {
		name:    "a trust bundle by neither",
		src:     v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{{ClusterTrustBundle: &v1.ClusterTrustBundleProjection{Path: "ca"}}}},
		wantErr: "ClusterTrustBundle projection requires either name or signerName to be set",
	}, {
		name: "a trust bundle selector that does not parse",
		src: v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{{ClusterTrustBundle: &v1.ClusterTrustBundleProjection{
			SignerName: &signer, Path: "ca", LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "k", Operator: "Near"}}}}}}},
		wantErr: "while parsing label selector",
	}, {
		name:    "a pod certificate with no path",
		src:     v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{{PodCertificate: &v1.PodCertificateProjection{SignerName: signer}}}},
		wantErr: "specify at least one of credentialBundlePath, keyPath, and certificateChainPath",
	}, {
		name:    "a downward API field the kubelet does not know",
		src:     v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{fieldItem("f", "spec.nodeName")}},
		wantErr: "sources[0] (downwardAPI):",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "", nil)
			spec := newSpec("vol", tc.src)
			err := e.ResolveSpec(testPod(), spec)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.HasPrefix(err.Error(), "projected volume "+string(spec.Name)+" of pod ns/pod: ") {
				t.Errorf("ResolveSpec: %v, want an error naming the pod and volume saying %q", err, tc.wantErr)
			}
			if errors.Is(err, volume.ErrNotReady) || spec.Attributes != nil {
				t.Errorf("ResolveSpec: %v not final, or attributes stored: %v", err, spec.Attributes)
			}
		})
	}
}

// TestResolveSpecNode: an item that reads a limit the container does not
// declare needs the node; the node not known is an error wrapping
// ErrNotReady, and the limit read is the node's.
func TestResolveSpecNode(t *testing.T) {
	src := v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{{DownwardAPI: &v1.DownwardAPIProjection{Items: []v1.DownwardAPIVolumeFile{
		{Path: "cpu", ResourceFieldRef: &v1.ResourceFieldSelector{ContainerName: "c", Resource: "limits.cpu"}}}}}}}
	e := newEnv(t, "", nil)
	spec := e.spec(t, testPod(), "vol", src)
	if got := spec.Attributes["file:0:cpu"]; got != "644::4" {
		t.Errorf("cpu file attribute %q, want the node's 4 cpus", got)
	}
	p, err := newPlugin(Config{RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil), Objects: e.objs, Tokens: e.tokens,
		NodeAllocatable: func() (v1.ResourceList, error) { return nil, errors.New("no node yet") }})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.ResolveSpec(testPod(), newSpec("vol", src)); !errors.Is(err, volume.ErrNotReady) || !strings.Contains(err.Error(), "error retrieving node: no node yet") {
		t.Errorf("ResolveSpec without the node: %v, want ErrNotReady", err)
	}
}

// TestPlugin: the plugin's name, the sources it claims, its capabilities,
// its Refs and its Config.
func TestPlugin(t *testing.T) {
	e := newEnv(t, "", nil)
	caps, err := e.Capabilities(nil)
	if e.Name() != PluginName || err != nil || !reflect.DeepEqual(caps, volume.Capabilities{Republish: true, ReadOnly: true}) {
		t.Errorf("Name %s, Capabilities %+v, %v", e.Name(), caps, err)
	}
	if !e.CanSupport(&v1.Volume{VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{}}}) ||
		e.CanSupport(&v1.Volume{VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{}}}) || e.CanSupport(nil) {
		t.Error("CanSupport claims the wrong sources")
	}
	signer := "example.com/s"
	src := &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
		cmSource("c", true), secretSource("s", false), tokenSource("t"),
		{ClusterTrustBundle: &v1.ClusterTrustBundleProjection{Name: ptr("b")}},
		{ClusterTrustBundle: &v1.ClusterTrustBundleProjection{SignerName: &signer, LabelSelector: selector("k", "v")}},
		{ClusterTrustBundle: &v1.ClusterTrustBundleProjection{SignerName: &signer, LabelSelector: &metav1.LabelSelector{}}},
		{ClusterTrustBundle: &v1.ClusterTrustBundleProjection{SignerName: &signer}}, // selects none
	}}
	want := []objectcache.Ref{
		{Kind: objectcache.ConfigMap, Namespace: "ns", Name: "c"},
		{Kind: objectcache.Secret, Namespace: "ns", Name: "s"},
		{Kind: objectcache.ClusterTrustBundle, Name: "b"},
		{Kind: objectcache.ClusterTrustBundle, Fields: "spec.signerName=example.com/s", Labels: "k=v"},
		{Kind: objectcache.ClusterTrustBundle, Fields: "spec.signerName=example.com/s"},
	}
	if got := refs("ns", src); !slices.Equal(got, want) {
		t.Errorf("Refs = %v, want %v", got, want)
	}
	if got := refs("ns", nil); got != nil {
		t.Errorf("Refs(nil) = %v", got)
	}
	// The volume manager asks the plugin (volume.ObjectReader).
	var r volume.ObjectReader = e.plugin
	if got := r.Objects("ns", &v1.Volume{VolumeSource: v1.VolumeSource{Projected: src}}); !slices.Equal(got, want) {
		t.Errorf("Objects = %v, want %v", got, want)
	}
	if got := r.Objects("ns", &v1.Volume{VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "s"}}}); got != nil {
		t.Errorf("Objects of a secret volume = %v, want none", got)
	}
	fake := mount.NewFakeMounter(nil)
	for _, cfg := range []Config{
		{Mounter: fake, Objects: e.objs, Tokens: e.tokens}, {RootDir: t.TempDir(), Objects: e.objs, Tokens: e.tokens},
		{RootDir: t.TempDir(), Mounter: fake, Tokens: e.tokens}, {RootDir: t.TempDir(), Mounter: fake, Objects: e.objs},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) succeeded", cfg)
		}
	}
}

// TestTrustBundleRefsRead: the selection SetUp lists is the Ref that Refs
// gives the volume manager to hold.
func TestTrustBundleRefsRead(t *testing.T) {
	signer := "example.com/s"
	src := v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{{ClusterTrustBundle: &v1.ClusterTrustBundleProjection{
		SignerName: &signer, Path: "ca", LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"x", "y"}}}}}}}}
	e := newEnv(t, "", nil)
	e.objs.Bundles = append(e.objs.Bundles, bundleOf("b", signer, map[string]string{"tier": "y"}, certPEM("A")))
	pod := testPod()
	spec := e.spec(t, pod, "vol", src)
	if _, err := e.SetUp(t.Context(), request(pod, spec, "vol", nil)); err != nil {
		t.Fatal(err)
	}
	if got := refs(objtest.NS, &src); !slices.Equal(e.objs.Listed, got) {
		t.Errorf("listed %v, held %v", e.objs.Listed, got)
	}
}
