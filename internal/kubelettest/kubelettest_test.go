package kubelettest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteConfig(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name    string
		cfg     Config
		wantErr bool
		want    []string
	}{
		{"complete", Config{RuntimeEndpoint: "unix:///run/cri.sock", Port: 10350, HealthzPort: 10351, PodLogsDir: "/logs"}, false,
			[]string{"containerRuntimeEndpoint: unix:///run/cri.sock\n", "imageServiceEndpoint: unix:///run/cri.sock\n",
				"port: 10350\n", "healthzPort: 10351\n", "podLogsDir: /logs\n", "failCgroupV1: false\n",
				"  imagefs.available: 1%\n", "  nodefs.available: 1%\n", "imageGCHighThresholdPercent: 100\n"}},
		{"no socket", Config{Port: 1, HealthzPort: 2, PodLogsDir: "/logs"}, true, nil},
		{"no port", Config{RuntimeEndpoint: "unix:///s", HealthzPort: 2, PodLogsDir: "/logs"}, true, nil},
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
