package adapter

import (
	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	nvm "github.com/nodevol/nodevol/volumemanager"
)

// fakeClient is a fake clientset holding this node's Node and objs.
func fakeClient(objs ...runtime.Object) *fake.Clientset {
	return fake.NewClientset(append([]runtime.Object{&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}}, objs...)...)
}

// privateRegistry gives a test's nodevol a registry of its own instead of
// the kubelet's global one.
func privateRegistry(c *nvm.Config) { c.Registerer = prometheus.NewRegistry() }
