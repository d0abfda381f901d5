package csiplugin

import (
	"context"
	"testing"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/nodevol/nodevol/csi"
)

// TestNewRegistrationHandler: the configuration reaches the handler (its
// checks run), and without a KubeClient Run returns at once.
func TestNewRegistrationHandler(t *testing.T) {
	if _, err := NewRegistrationHandler(RegistrationConfig{}); err == nil {
		t.Error("no registry: want an error")
	}
	reg := csi.NewRegistry(csi.RegistryOptions{})
	defer reg.Close()
	if _, err := NewRegistrationHandler(RegistrationConfig{Registry: reg, KubeClient: fake.NewClientset()}); err == nil {
		t.Error("KubeClient without NodeName: want an error")
	}
	h, err := NewRegistrationHandler(RegistrationConfig{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Run(context.Background()); err != nil {
		t.Errorf("Run without a KubeClient = %v", err)
	}
	if err := h.ValidatePlugin(context.Background(), "bad name!", "/nowhere.sock", []string{"1.0.0"}); err == nil {
		t.Error("ValidatePlugin accepted an invalid driver name")
	}
}
