package testenv

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// TestWriteKubeconfig writes a kubeconfig file for the admin, a token user
// and a node's client certificate, loads each as a client does
// (clientcmd.BuildConfigFromFlags) and asks the apiserver who the client
// is (a SelfSubjectReview, which every authenticated user may create).
func TestWriteKubeconfig(t *testing.T) {
	alice := User{Name: "alice", Groups: []string{"team-a"}}
	env := StartT(t, Options{Users: []User{alice}})
	node := User{Name: "system:node:node-1", Groups: []string{"system:nodes"}}
	tokenCfg, err := env.TokenConfig(alice.Name)
	if err != nil {
		t.Fatal(err)
	}
	certCfg, err := env.CertConfig(node)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		cfg        *rest.Config
		user       string
		wantGroups []string
	}{
		{name: "admin", cfg: env.Config(), user: adminName, wantGroups: []string{"system:masters"}},
		{name: "token", cfg: tokenCfg, user: alice.Name, wantGroups: alice.Groups},
		{name: "node certificate", cfg: certCfg, user: node.Name, wantGroups: node.Groups},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "kubeconfig")
			if err := env.WriteKubeconfig(path, tt.cfg); err != nil {
				t.Fatal(err)
			}
			if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("kubeconfig file: %v, %v; want mode 0600", fi, err)
			}
			loaded, err := clientcmd.BuildConfigFromFlags("", path)
			if err != nil {
				t.Fatal(err)
			}
			review, err := kubernetes.NewForConfigOrDie(loaded).AuthenticationV1().SelfSubjectReviews().Create(
				t.Context(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("a client of the written kubeconfig: %v", err)
			}
			got := review.Status.UserInfo
			if got.Username != tt.user {
				t.Errorf("the server sees user %q, want %q", got.Username, tt.user)
			}
			for _, g := range tt.wantGroups {
				if !slices.Contains(got.Groups, g) {
					t.Errorf("the server sees groups %v, want %s among them", got.Groups, g)
				}
			}
			kc, err := clientcmd.LoadFromFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if kc.Contexts[kc.CurrentContext] == nil || kc.Contexts[kc.CurrentContext].AuthInfo != tt.user {
				t.Errorf("current context %q is %+v, want user %q", kc.CurrentContext, kc.Contexts[kc.CurrentContext], tt.user)
			}
		})
	}
}

// TestWriteKubeconfigRefuses checks that configs WriteKubeconfig cannot
// write as a working kubeconfig are refused, with no file written.
func TestWriteKubeconfigRefuses(t *testing.T) {
	env := &Env{apiPort: 6443, tokens: map[string]string{}, ca: &authority{}}
	tests := []struct {
		name string
		cfg  *rest.Config
		want string
	}{
		{name: "nil", want: "no client config"},
		{name: "other server", cfg: &rest.Config{Host: "https://127.0.0.1:1", BearerToken: "t"}, want: "not this environment's apiserver"},
		{name: "no credentials", cfg: &rest.Config{Host: env.host()}, want: "neither a bearer token nor a client certificate"},
		{name: "certificate not PEM", cfg: &rest.Config{Host: env.host(), TLSClientConfig: rest.TLSClientConfig{CertData: []byte("x"), KeyData: []byte("y")}}, want: "not PEM"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "kubeconfig")
			err := env.WriteKubeconfig(path, tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want one saying %q", err, tt.want)
			}
			if _, statErr := os.Stat(path); !os.IsNotExist(statErr) {
				t.Errorf("a file was written: %v", statErr)
			}
		})
	}
}
