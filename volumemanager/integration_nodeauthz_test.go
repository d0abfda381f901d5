package volumemanager

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"testing"

	certificatesv1 "k8s.io/api/certificates/v1"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// nodeRead is one read a node makes with its own client.
type nodeRead func(ctx context.Context, c kubernetes.Interface) error

// byName are the list options of one object: the field selector
// metadata.name, the form the object cache lists and watches with.
func byName(name string) metav1.ListOptions {
	return metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()}
}

// streamed is byName as a watch-list request (the initial events
// first), the object cache's first read of an object.
func streamed(name string) metav1.ListOptions {
	o := byName(name)
	o.SendInitialEvents = ptr.To(true)
	o.ResourceVersionMatch = metav1.ResourceVersionMatchNotOlderThan
	o.AllowWatchBookmarks = true
	return o
}

// watched turns a watch into a read: it is stopped at once.
func watched(w watch.Interface, err error) error {
	if err == nil {
		w.Stop()
	}
	return err
}

// listed turns a list into a read.
func listed[T any](_ T, err error) error { return err }

// TestIntegrationNodeAuthorizerReads pins down what the Node authorizer
// (with NodeRestriction) of the API server testenv runs lets a node read,
// verb by verb, for every kind nodevol reads with a node's credentials: the
// object cache chooses a watch or a GET by
// it (see the objectcache package). The node reads with its own client
// certificate; the objects are referenced by a pod bound to the node,
// besides the ones that are not.
func TestIntegrationNodeAuthorizerReads(t *testing.T) {
	e := startObjectsEnv(t)
	ctx := t.Context()
	e.createObjects(t, map[string]map[string]string{"cm": {"k": "v"}, "cm-other": {"k": "v"}},
		map[string]map[string]string{"sec": {"k": "v"}, "sec-other": {"k": "v"}})
	if _, err := e.admin.CoreV1().ServiceAccounts(objectsNS).Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "worker"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pv := nrCreateClaim(t, e.admin, objectsNS, "claim", "loop.csi.nodevol.io")
	if _, err := e.admin.CertificatesV1().ClusterTrustBundles().Create(ctx, &certificatesv1.ClusterTrustBundle{
		ObjectMeta: metav1.ObjectMeta{Name: "site"}, Spec: certificatesv1.ClusterTrustBundleSpec{TrustBundle: newTestCA(t, "site").pem()},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, va := range []*storagev1.VolumeAttachment{attachment("va-mine", node, pv.Name), attachment("va-other", "node-2", pv.Name)} {
		if _, err := e.admin.StorageV1().VolumeAttachments().Create(ctx, va, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pod := e.createPod(t, csitest.Pod(objectsNS, "web", csitest.PodSpec{Node: node, ServiceAccount: "worker", Volumes: []csitest.PodVolume{
		objectVolume("conf", "cm", "", false),
		objectVolume("creds", "", "sec", false),
		{Name: "data", Claim: "claim"},
		{Name: "identity", Source: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{
			Sources: []v1.VolumeProjection{{PodCertificate: &v1.PodCertificateProjection{SignerName: podSigner, KeyType: "ECDSAP256", CertificateChainPath: "c"}}},
		}}, ReadOnly: true},
	}}))
	e.waitNodeMayGet(t, "persistentvolumeclaims", "claim")
	e.waitNodeMayGet(t, "serviceaccounts", "worker")
	nodeClient := kubernetes.NewForConfigOrDie(e.nodeCfg)
	pcr := e.nodeCreatesPCR(t, nodeClient, pod)

	for _, tt := range nodeReads(pv.Name, pcr) {
		err := tt.read(ctx, nodeClient)
		switch {
		case tt.allowed && err != nil:
			t.Errorf("%s: %v, want allowed", tt.name, err)
		case !tt.allowed && !apierrors.IsForbidden(err):
			t.Errorf("%s: %v, want Forbidden", tt.name, err)
		}
	}
}

// nodeReadCase is a read of the node and whether the Node authorizer
// allows it.
type nodeReadCase struct {
	name    string
	read    nodeRead
	allowed bool
}

// nodeReads are the reads TestIntegrationNodeAuthorizerReads makes: pv is
// the volume bound to the pod's claim, pcr the node's own request.
func nodeReads(pv, pcr string) []nodeReadCase {
	mine := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()}
	return []nodeReadCase{
		{"configmaps get referenced", func(ctx context.Context, c kubernetes.Interface) error {
			return listed(c.CoreV1().ConfigMaps(objectsNS).Get(ctx, "cm", metav1.GetOptions{}))
		}, true},
		{"configmaps list by name", func(ctx context.Context, c kubernetes.Interface) error {
			return listed(c.CoreV1().ConfigMaps(objectsNS).List(ctx, byName("cm")))
		}, true},
		{"configmaps watch by name", func(ctx context.Context, c kubernetes.Interface) error {
			return watched(c.CoreV1().ConfigMaps(objectsNS).Watch(ctx, byName("cm")))
		}, true},
		{"configmaps watch-list by name", func(ctx context.Context, c kubernetes.Interface) error {
			return watched(c.CoreV1().ConfigMaps(objectsNS).Watch(ctx, streamed("cm")))
		}, true},
		{"configmaps watch-list unreferenced", func(ctx context.Context, c kubernetes.Interface) error {
			return watched(c.CoreV1().ConfigMaps(objectsNS).Watch(ctx, streamed("cm-other")))
		}, false},
		{"configmaps get unreferenced", func(ctx context.Context, c kubernetes.Interface) error {
			return listed(c.CoreV1().ConfigMaps(objectsNS).Get(ctx, "cm-other", metav1.GetOptions{}))
		}, false},
		{"configmaps list all", func(ctx context.Context, c kubernetes.Interface) error {
			return listed(c.CoreV1().ConfigMaps(objectsNS).List(ctx, metav1.ListOptions{}))
		}, false},
		{"secrets get referenced", func(ctx context.Context, c kubernetes.Interface) error {
			return listed(c.CoreV1().Secrets(objectsNS).Get(ctx, "sec", metav1.GetOptions{}))
		}, true},
		{"secrets list by name", func(ctx context.Context, c kubernetes.Interface) error {
			return listed(c.CoreV1().Secrets(objectsNS).List(ctx, byName("sec")))
		}, true},
		{"secrets watch by name", func(ctx context.Context, c kubernetes.Interface) error {
			return watched(c.CoreV1().Secrets(objectsNS).Watch(ctx, byName("sec")))
		}, true},
		{"secrets watch-list by name", func(ctx context.Context, c kubernetes.Interface) error {
			return watched(c.CoreV1().Secrets(objectsNS).Watch(ctx, streamed("sec")))
		}, true},
		{"secrets get unreferenced", func(ctx context.Context, c kubernetes.Interface) error {
			return listed(c.CoreV1().Secrets(objectsNS).Get(ctx, "sec-other", metav1.GetOptions{}))
		}, false},
		{"secrets watch all", func(ctx context.Context, c kubernetes.Interface) error {
			return watched(c.CoreV1().Secrets(objectsNS).Watch(ctx, metav1.ListOptions{}))
		}, false},
		{"serviceaccounts get the pod's", func(ctx context.Context, c kubernetes.Interface) error {
			return listed(c.CoreV1().ServiceAccounts(objectsNS).Get(ctx, "worker", metav1.GetOptions{}))
		}, true},
		{"serviceaccounts list by name", func(ctx context.Context, c kubernetes.Interface) error {
			return listed(c.CoreV1().ServiceAccounts(objectsNS).List(ctx, byName("worker")))
		}, false},
		{"clustertrustbundles get", func(ctx context.Context, c kubernetes.Interface) error {
			return listed(c.CertificatesV1().ClusterTrustBundles().Get(ctx, "site", metav1.GetOptions{}))
		}, true},
		{"clustertrustbundles list all", func(ctx context.Context, c kubernetes.Interface) error {
			return listed(c.CertificatesV1().ClusterTrustBundles().List(ctx, metav1.ListOptions{}))
		}, true},
		{"clustertrustbundles watch all", func(ctx context.Context, c kubernetes.Interface) error {
			return watched(c.CertificatesV1().ClusterTrustBundles().Watch(ctx, metav1.ListOptions{}))
		}, true},
		{"podcertificaterequests get own", func(ctx context.Context, c kubernetes.Interface) error {
			return listed(c.CertificatesV1().PodCertificateRequests(objectsNS).Get(ctx, pcr, metav1.GetOptions{}))
		}, true},
		{"podcertificaterequests list by name", func(ctx context.Context, c kubernetes.Interface) error {
			return listed(c.CertificatesV1().PodCertificateRequests(objectsNS).List(ctx, byName(pcr)))
		}, false},
		{"podcertificaterequests list spec.nodeName", func(ctx context.Context, c kubernetes.Interface) error {
			return listed(c.CertificatesV1().PodCertificateRequests("").List(ctx, mine))
		}, true},
		{"podcertificaterequests watch spec.nodeName", func(ctx context.Context, c kubernetes.Interface) error {
			return watched(c.CertificatesV1().PodCertificateRequests("").Watch(ctx, mine))
		}, true},
		{"podcertificaterequests list all", func(ctx context.Context, c kubernetes.Interface) error {
			return listed(c.CertificatesV1().PodCertificateRequests("").List(ctx, metav1.ListOptions{}))
		}, false},
		{"persistentvolumeclaims get referenced", func(ctx context.Context, c kubernetes.Interface) error {
			return listed(c.CoreV1().PersistentVolumeClaims(objectsNS).Get(ctx, "claim", metav1.GetOptions{}))
		}, true},
		{"persistentvolumeclaims list by name", func(ctx context.Context, c kubernetes.Interface) error {
			return listed(c.CoreV1().PersistentVolumeClaims(objectsNS).List(ctx, byName("claim")))
		}, false},
		{"persistentvolumeclaims watch by name", func(ctx context.Context, c kubernetes.Interface) error {
			return watched(c.CoreV1().PersistentVolumeClaims(objectsNS).Watch(ctx, byName("claim")))
		}, false},
		{"persistentvolumes get bound to a referenced claim", func(ctx context.Context, c kubernetes.Interface) error {
			return listed(c.CoreV1().PersistentVolumes().Get(ctx, pv, metav1.GetOptions{}))
		}, true},
		{"persistentvolumes list by name", func(ctx context.Context, c kubernetes.Interface) error {
			return listed(c.CoreV1().PersistentVolumes().List(ctx, byName(pv)))
		}, false},
		{"persistentvolumes watch by name", func(ctx context.Context, c kubernetes.Interface) error {
			return watched(c.CoreV1().PersistentVolumes().Watch(ctx, byName(pv)))
		}, false},
		{"volumeattachments get the node's", func(ctx context.Context, c kubernetes.Interface) error {
			return listed(c.StorageV1().VolumeAttachments().Get(ctx, "va-mine", metav1.GetOptions{}))
		}, true},
		{"volumeattachments get another node's", func(ctx context.Context, c kubernetes.Interface) error {
			return listed(c.StorageV1().VolumeAttachments().Get(ctx, "va-other", metav1.GetOptions{}))
		}, false},
		{"volumeattachments list by name", func(ctx context.Context, c kubernetes.Interface) error {
			return listed(c.StorageV1().VolumeAttachments().List(ctx, byName("va-mine")))
		}, false},
		{"volumeattachments watch by name", func(ctx context.Context, c kubernetes.Interface) error {
			return watched(c.StorageV1().VolumeAttachments().Watch(ctx, byName("va-mine")))
		}, false},
	}
}

// attachment is a VolumeAttachment of pv to nodeName.
func attachment(name, nodeName, pv string) *storagev1.VolumeAttachment {
	return &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: "loop.csi.nodevol.io", NodeName: nodeName,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}},
	}
}

// nodeCreatesPCR creates, with the node's client, a PodCertificateRequest
// for pod's podCertificate source, as a kubelet does, and returns its name.
func (e *objectsEnv) nodeCreatesPCR(t *testing.T, c kubernetes.Interface, pod *v1.Pod) string {
	t.Helper()
	ctx := t.Context()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sa, err := c.CoreV1().ServiceAccounts(pod.Namespace).Get(ctx, pod.Spec.ServiceAccountName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pcr, err := c.CertificatesV1().PodCertificateRequests(pod.Namespace).Create(ctx, &certificatesv1.PodCertificateRequest{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, GenerateName: "req-"},
		Spec: certificatesv1.PodCertificateRequestSpec{
			SignerName: podSigner, PodName: pod.Name, PodUID: pod.UID, ServiceAccountName: sa.Name, ServiceAccountUID: sa.UID,
			NodeName: node, NodeUID: n.UID, StubPKCS10Request: csr,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the node's own PodCertificateRequest: %v", err)
	}
	eventually(t, "the Node authorizer to learn PodCertificateRequest "+pcr.Name, func() bool {
		review, err := e.admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, groupAccessReview(certificatesv1.GroupName, "podcertificaterequests", objectsNS, pcr.Name), metav1.CreateOptions{})
		return err == nil && review.Status.Allowed
	})
	return pcr.Name
}
