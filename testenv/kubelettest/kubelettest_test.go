package kubelettest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestUnescape(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"/var/lib/kubelet", "/var/lib/kubelet"},
		{`/mnt/a\040b`, "/mnt/a b"},
		{`/mnt/tab\011x\134y`, "/mnt/tab\tx\\y"},
		{`/mnt/short\04`, `/mnt/short\04`},
		{`/mnt/not\9xx`, `/mnt/not\9xx`},
	} {
		if got := unescape(tc.in); got != tc.want {
			t.Errorf("unescape(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestWriteConfig(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name    string
		cfg     Config
		wantErr bool
		want    []string
	}{
		{"complete", Config{RuntimeSocket: "/run/cri.sock", Port: 10350, HealthzPort: 10351, PodLogsDir: "/logs"}, false,
			[]string{"containerRuntimeEndpoint: unix:///run/cri.sock\n", "imageServiceEndpoint: unix:///run/cri.sock\n",
				"port: 10350\n", "healthzPort: 10351\n", "podLogsDir: /logs\n", "failCgroupV1: false\n"}},
		{"no socket", Config{Port: 1, HealthzPort: 2, PodLogsDir: "/logs"}, true, nil},
		{"no port", Config{RuntimeSocket: "/s", HealthzPort: 2, PodLogsDir: "/logs"}, true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, tc.name+".yaml")
			err := WriteConfig(path, tc.cfg)
			if (err != nil) != tc.wantErr {
				t.Fatalf("WriteConfig: %v, want error %v", err, tc.wantErr)
			}
			if tc.wantErr {
				return
			}
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(data), w) {
					t.Errorf("config lacks %q:\n%s", w, data)
				}
			}
		})
	}
}
