package agent

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

// TestNodePodsTrimmed: the informer of the node's pods keeps them without
// managedFields, and keeps the rest; the pod the API gave is not written.
func TestNodePodsTrimmed(t *testing.T) {
	managed := []metav1.ManagedFieldsEntry{{Manager: "kube-scheduler", Operation: metav1.ManagedFieldsOperationUpdate}}
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "uid-1", ManagedFields: managed,
			Annotations: map[string]string{"a": "b"}},
		Spec: v1.PodSpec{NodeName: "node-1", Volumes: []v1.Volume{{Name: "data", VolumeSource: v1.VolumeSource{
			PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "claim"}}}}},
	}
	client := fake.NewClientset(pod.DeepCopy())
	f := nodePods(client, "node-1")
	inf := f.Core().V1().Pods().Informer()
	f.Start(t.Context().Done())
	if !cache.WaitForCacheSync(t.Context().Done(), inf.HasSynced) {
		t.Fatal("the pod informer did not sync")
	}
	got, err := f.Core().V1().Pods().Lister().Pods("ns").Get("p")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.ManagedFields) != 0 {
		t.Errorf("the pod is kept with %d managedFields entries, want none", len(got.ManagedFields))
	}
	if got.UID != pod.UID || got.Annotations["a"] != "b" || len(got.Spec.Volumes) != 1 || got.Spec.Volumes[0].PersistentVolumeClaim.ClaimName != "claim" {
		t.Errorf("the pod kept is %+v, want all but managedFields of %+v", got, pod)
	}

	in := pod.DeepCopy()
	out, err := trimPod(in)
	if err != nil {
		t.Fatal(err)
	}
	if len(in.ManagedFields) != 1 || len(out.(*v1.Pod).ManagedFields) != 0 {
		t.Errorf("trimPod wrote its argument or kept managedFields: in %d, out %d entries", len(in.ManagedFields), len(out.(*v1.Pod).ManagedFields))
	}
	if again, _ := trimPod(out); again != out {
		t.Error("trimPod of a trimmed pod is not the pod itself")
	}
	if tomb, _ := trimPod(cache.DeletedFinalStateUnknown{Key: "ns/p"}); tomb != (cache.DeletedFinalStateUnknown{Key: "ns/p"}) {
		t.Error("trimPod changed what is not a pod")
	}
}
