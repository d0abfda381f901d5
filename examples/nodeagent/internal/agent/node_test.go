package agent

import (
	"context"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nodevol/nodevol/registration"
	"github.com/nodevol/nodevol/volumemanager"
)

// TestUpdateNodeAttachMode: the agent sets the Node's
// controller-managed-attach-detach annotation as its attach mode says.
func TestUpdateNodeAttachMode(t *testing.T) {
	const key = registration.ControllerManagedAttachDetachAnnotation
	for _, tt := range []struct {
		name       string
		selfAttach bool
		before     map[string]string
		want       map[string]string
		updates    int
	}{
		{"controller-managed", false, nil, map[string]string{key: "true"}, 1},
		{"controller-managed, already", false, map[string]string{key: "true"}, map[string]string{key: "true"}, 0},
		{"self-attach", true, map[string]string{key: "true", "x": "y"}, map[string]string{"x": "y"}, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			client := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", Annotations: tt.before}})
			vm, err := volumemanager.New(volumemanager.Config{NodeName: "node-1", KubeClient: client, RootDir: t.TempDir(), SelfAttach: tt.selfAttach})
			if err != nil {
				t.Fatal(err)
			}
			if err := updateNodeAttachMode(ctx, client, vm, "node-1"); err != nil {
				t.Fatal(err)
			}
			n, _ := client.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
			if len(n.Annotations) != len(tt.want) || n.Annotations[key] != tt.want[key] || n.Annotations["x"] != tt.want["x"] {
				t.Errorf("annotations %v, want %v", n.Annotations, tt.want)
			}
			updates := 0
			for _, a := range client.Actions() {
				if a.GetVerb() == "update" {
					updates++
				}
			}
			if updates != tt.updates {
				t.Errorf("%d updates, want %d", updates, tt.updates)
			}
		})
	}
	vm, err := volumemanager.New(volumemanager.Config{NodeName: "node-1", KubeClient: fake.NewClientset(), RootDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := updateNodeAttachMode(context.Background(), fake.NewClientset(), vm, "node-1"); err != nil {
		t.Errorf("missing Node: %v", err)
	}
}
