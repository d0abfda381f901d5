package projected

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	certificatesv1 "k8s.io/api/certificates/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/internal/objvolume/objtest"
)

// setUpCase is a SetUp of TestSetUp and what it should do.
type setUpCase struct {
	name    string
	objs    []runtime.Object
	bundles []*certificatesv1.ClusterTrustBundle
	sources []v1.VolumeProjection
	mode    *int32 // the volume's defaultMode (nil: 0644)
	runAs   *int64 // the pod's runAsUser
	fsGroup bool   // the pod's fsGroup: the test's group
	noCerts bool   // a plugin without PodCertificates
	noToken bool   // the token cache refuses the token
	want    map[string]string
	wantErr []string
	// kubelet is the kubelet's words for the error (volume.EventCause),
	// what a pod's event says of it.
	kubelet string
	// notFound: the error is apierrors.IsNotFound (one missing object).
	notFound bool
}

// own is a file of mode and content with the test's owner, as readVolume
// shows it.
func own(mode int, content string) string {
	return fmt.Sprintf("%#o:%d:%d:%s", mode, os.Getuid(), os.Getgid(), content)
}

func cmSource(name string, optional bool, items ...v1.KeyToPath) v1.VolumeProjection {
	return v1.VolumeProjection{ConfigMap: &v1.ConfigMapProjection{LocalObjectReference: v1.LocalObjectReference{Name: name}, Items: items, Optional: &optional}}
}

func secretSource(name string, optional bool, items ...v1.KeyToPath) v1.VolumeProjection {
	return v1.VolumeProjection{Secret: &v1.SecretProjection{LocalObjectReference: v1.LocalObjectReference{Name: name}, Items: items, Optional: &optional}}
}

func tokenSource(p string) v1.VolumeProjection {
	return v1.VolumeProjection{ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: p, ExpirationSeconds: ptr[int64](3600)}}
}

func certPEM(der string) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte(der)}))
}

func objectCases() []setUpCase {
	return []setUpCase{{
		name:    "configMap items and all keys of a secret, the volume's defaultMode and an item's mode",
		objs:    []runtime.Object{objtest.ConfigMap("c", map[string]string{"a": "A", "b": "B"}, nil), objtest.Secret("s", map[string]string{"x": "X", "y": "Y"})},
		sources: []v1.VolumeProjection{cmSource("c", false, v1.KeyToPath{Key: "a", Path: "etc/a"}, v1.KeyToPath{Key: "b", Path: "b", Mode: ptr[int32](0o400)}), secretSource("s", false)},
		mode:    ptr[int32](0o440),
		want:    map[string]string{"etc/a": own(0o440, "A"), "b": own(0o400, "B"), "x": own(0o440, "X"), "y": own(0o440, "Y")},
	}, {
		name: "optional sources: a missing object adds nothing, a missing key is skipped",
		objs: []runtime.Object{objtest.Secret("s", map[string]string{"x": "X"})},
		sources: []v1.VolumeProjection{cmSource("gone", true), secretSource("s", true, v1.KeyToPath{Key: "x", Path: "x"}, v1.KeyToPath{Key: "nope", Path: "n"}),
			cmSource("gone", true, v1.KeyToPath{Key: "k", Path: "k"})},
		want: map[string]string{"x": own(0o644, "X")},
	}, {
		name:     "a missing configMap: the kubelet's error",
		sources:  []v1.VolumeProjection{cmSource("c", false)},
		wantErr:  []string{`setting up projected volume "vol" of pod ns/pod: configmap "c" not found`},
		kubelet:  `configmap "c" not found`,
		notFound: true,
	}, {
		name:    "a missing key: the kubelet's error, naming the object",
		objs:    []runtime.Object{objtest.Secret("s", map[string]string{"x": "X"})},
		sources: []v1.VolumeProjection{secretSource("s", false, v1.KeyToPath{Key: "nope", Path: "n"})},
		wantErr: []string{`secret ns/s: references non-existent secret key: nope`},
		kubelet: `references non-existent secret key: nope`,
	}, {
		name:    "every source's error, aggregated",
		sources: []v1.VolumeProjection{cmSource("c", false), secretSource("s", false), tokenSource("token")},
		wantErr: []string{`[configmap "c" not found, secret "s" not found]`},
		kubelet: `[configmap "c" not found, secret "s" not found]`,
	}, {
		name:    "a key that is not a file name is refused",
		objs:    []runtime.Object{objtest.ConfigMap("c", map[string]string{"..": "X"}, nil)},
		sources: []v1.VolumeProjection{cmSource("c", false)},
		wantErr: []string{`configmap ns/c: key ".."`, "must not contain '..'"},
	}, {
		name: "a path two sources give is the later source's file, as in the kubelet",
		objs: []runtime.Object{objtest.ConfigMap("c", map[string]string{"token": "from the configMap", "a": "A"}, nil)},
		sources: []v1.VolumeProjection{cmSource("c", false), tokenSource("token"),
			{DownwardAPI: &v1.DownwardAPIProjection{Items: []v1.DownwardAPIVolumeFile{{Path: "a", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}}},
		want: map[string]string{"token": own(0o644, "app-0"), "a": own(0o644, "pod")},
	}}
}

func tokenCases() []setUpCase {
	uid := int64(os.Getuid())
	labels := v1.VolumeProjection{DownwardAPI: &v1.DownwardAPIProjection{Items: []v1.DownwardAPIVolumeFile{{Path: "labels", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.labels"}}}}}
	return []setUpCase{{
		name:    "a token and downward API files with the volume's defaultMode",
		sources: []v1.VolumeProjection{tokenSource("token"), labels},
		mode:    ptr[int32](0o444),
		want:    map[string]string{"token": own(0o444, "app-0"), "labels": own(0o444, `app="web"`)},
	}, {
		name:    "with an fsGroup: the token 0600 plus group read, the other files the defaultMode plus group read",
		sources: []v1.VolumeProjection{tokenSource("token"), labels},
		mode:    ptr[int32](0o400),
		fsGroup: true,
		want:    map[string]string{"token": own(0o640, "app-0"), "labels": own(0o440, `app="web"`)},
	}, {
		name:    "with one runAsUser: the token 0600 and owned by it",
		sources: []v1.VolumeProjection{tokenSource("token"), labels},
		runAs:   &uid,
		want:    map[string]string{"token": own(0o600, "app-0"), "labels": own(0o644, `app="web"`)},
	}, {
		name:    "a token refused: the kubelet's error",
		sources: []v1.VolumeProjection{tokenSource("token")},
		noToken: true,
		wantErr: []string{`failed to fetch token: service account ns/app: refused`},
		kubelet: `failed to fetch token: refused`,
	}, {
		name:    "podCertificate: bundle, key and chain, with the token's mode rule",
		sources: []v1.VolumeProjection{{PodCertificate: &v1.PodCertificateProjection{SignerName: "example.com/s", CredentialBundlePath: "creds.pem", KeyPath: "tls.key", CertificateChainPath: "tls.crt"}}},
		fsGroup: true,
		want:    map[string]string{"creds.pem": own(0o640, "KEY\nCHAIN\n"), "tls.key": own(0o640, "KEY\n"), "tls.crt": own(0o640, "CHAIN\n")},
	}, {
		name:    "podCertificate without a pod certificate manager: an error naming it",
		sources: []v1.VolumeProjection{{PodCertificate: &v1.PodCertificateProjection{SignerName: "example.com/s", KeyPath: "tls.key"}}},
		noCerts: true,
		wantErr: []string{"sources[0]: podCertificate projection: no pod certificate manager is configured"},
	}}
}

func bundleCases() []setUpCase {
	a, b, c := certPEM("A"), certPEM("B"), certPEM("C")
	signer := "example.com/signer"
	bundles := []*certificatesv1.ClusterTrustBundle{
		bundleOf("one", signer, map[string]string{"tier": "x"}, c, a),
		bundleOf("two", signer, map[string]string{"tier": "x"}, "junk\n", b, a),
		bundleOf("three", signer, map[string]string{"tier": "y"}, certPEM("Y")),
		bundleOf("other", "example.com/other", map[string]string{"tier": "x"}, certPEM("O")),
	}
	ctb := func(p *v1.ClusterTrustBundleProjection) []v1.VolumeProjection {
		return []v1.VolumeProjection{{ClusterTrustBundle: p}}
	}
	return []setUpCase{{
		name:    "a bundle by name",
		bundles: bundles,
		sources: ctb(&v1.ClusterTrustBundleProjection{Name: ptr("one"), Path: "ca.pem"}),
		want:    map[string]string{"ca.pem": own(0o644, a+c)},
	}, {
		name:    "a signer's bundles by label: each certificate once, sorted, other signers' and labels' left out",
		bundles: bundles,
		sources: ctb(&v1.ClusterTrustBundleProjection{SignerName: &signer, LabelSelector: selector("tier", "x"), Path: "ca.pem"}),
		fsGroup: true,
		want:    map[string]string{"ca.pem": own(0o640, a+b+c)},
	}, {
		name:    "a selection of none: the kubelet's error",
		bundles: bundles,
		sources: ctb(&v1.ClusterTrustBundleProjection{SignerName: &signer, LabelSelector: selector("tier", "z"), Path: "ca.pem"}),
		wantErr: []string{"combination of signerName and labelSelector matched zero ClusterTrustBundles"},
		kubelet: "combination of signerName and labelSelector matched zero ClusterTrustBundles",
	}, {
		name:    "a signer without a label selector selects none: optional, an empty file",
		bundles: bundles,
		sources: ctb(&v1.ClusterTrustBundleProjection{SignerName: &signer, Optional: ptr(true), Path: "ca.pem"}),
		want:    map[string]string{"ca.pem": own(0o644, "")},
	}, {
		name:    "a missing bundle, optional: an empty file",
		sources: ctb(&v1.ClusterTrustBundleProjection{Name: ptr("gone"), Optional: ptr(true), Path: "ca.pem"}),
		want:    map[string]string{"ca.pem": own(0o644, "")},
	}, {
		name:     "a missing bundle: the kubelet's error",
		sources:  ctb(&v1.ClusterTrustBundleProjection{Name: ptr("gone"), Path: "ca.pem"}),
		wantErr:  []string{`while getting ClusterTrustBundle: clustertrustbundle.certificates.k8s.io "gone" not found`},
		kubelet:  `while getting ClusterTrustBundle: clustertrustbundle.certificates.k8s.io "gone" not found`,
		notFound: true,
	}}
}

// TestSetUp: each kind of source, optional and missing, with the modes and
// owners of the kubelet; and the errors that leave nothing behind.
func TestSetUp(t *testing.T) {
	for _, tc := range slices.Concat(objectCases(), tokenCases(), bundleCases()) {
		t.Run(tc.name, func(t *testing.T) { runSetUp(t, tc) })
	}
}

func runSetUp(t *testing.T, tc setUpCase) {
	ctx := context.Background()
	e := newEnv(t, "", nil)
	for _, o := range tc.objs {
		e.objs.Put(o)
	}
	e.objs.Bundles = tc.bundles
	if tc.noCerts {
		e.certs = nil
		e.plugin.certs = nil
	}
	if tc.noToken {
		e.tokens.err = errors.New("refused")
	}
	pod := testPod()
	if tc.runAs != nil {
		pod.Spec.SecurityContext = &v1.PodSecurityContext{RunAsUser: tc.runAs}
	}
	var fsGroup *int64
	if tc.fsGroup {
		fsGroup = ptr(int64(os.Getgid()))
	}
	spec := e.spec(t, pod, "vol", v1.ProjectedVolumeSource{Sources: tc.sources, DefaultMode: tc.mode})
	e.steps.Taken()
	dir, err := e.SetUp(ctx, request(pod, spec, "vol", fsGroup))
	if tc.wantErr != nil {
		if err == nil {
			t.Fatalf("SetUp succeeded, want an error saying %q", tc.wantErr)
		}
		for _, w := range tc.wantErr {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not say %q", err, w)
			}
		}
		if _, cause := volume.EventCause(err); tc.kubelet != "" && cause != tc.kubelet {
			t.Errorf("the kubelet's words %q, want %q", cause, tc.kubelet)
		}
		if apierrors.IsNotFound(err) != tc.notFound || volume.IsUncertain(err) {
			t.Errorf("error %v: not found %v (want %v), uncertain %v (want false)", err, apierrors.IsNotFound(err), tc.notFound, volume.IsUncertain(err))
		}
		if s := e.steps.Taken(); len(s) != 0 || objtest.Exists(t, filepath.Join(e.root, "pods")) {
			t.Errorf("the failed SetUp changed the node: %v", s)
		}
		return
	}
	if err != nil {
		t.Fatalf("SetUp: %v", err)
	}
	if dir != e.dir("vol") {
		t.Errorf("SetUp returned %s, want %s", dir, e.dir("vol"))
	}
	if got := objtest.ReadVolume(t, dir, true); !maps.Equal(got, tc.want) {
		t.Errorf("files %v, want %v", got, tc.want)
	}
	e.steps.Taken()
	mps, _ := e.fake.List()
	if len(mps) != 1 || mps[0].Path != dir || mps[0].Type != "tmpfs" || !slices.Contains(mps[0].Opts, "size=67108864") {
		t.Errorf("mounts %+v, want a tmpfs of the pod's 64Mi at %s", mps, dir)
	}
	if _, err := e.SetUp(ctx, request(pod, spec, "vol", fsGroup)); err != nil || len(e.steps.Taken()) != 0 {
		t.Errorf("SetUp again: %v, or it changed something", err)
	}
}
