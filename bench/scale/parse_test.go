package scale

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseMetrics(t *testing.T) {
	const text = `# HELP go_memstats_heap_inuse_bytes Number of heap bytes that are in use.
# TYPE go_memstats_heap_inuse_bytes gauge
go_memstats_heap_inuse_bytes 1.2345e+07
go_gc_duration_seconds{quantile="0.5"} 0.0001
go_gc_duration_seconds_sum 0.01
go_gc_duration_seconds_count 7
go_memstats_heap_inuse_bytes_total 3
`
	tests := []struct {
		name    string
		names   []string
		want    map[string]float64
		wantErr string
	}{
		{"unlabelled samples", []string{heapMetric, gcMetric}, map[string]float64{heapMetric: 12345000, gcMetric: 7}, ""},
		{"a labelled sample is not the metric", []string{"go_gc_duration_seconds"}, nil, "no metric go_gc_duration_seconds"},
		{"missing", []string{"go_threads"}, nil, "no metric go_threads"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseMetrics(strings.NewReader(text), tt.names...)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one with %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("metrics (-want +got):\n%s", diff)
			}
		})
	}
	if _, err := parseMetrics(strings.NewReader(heapMetric+" many\n"), heapMetric); err == nil {
		t.Error("a value that is not a number: no error")
	}
}

func TestParseStatus(t *testing.T) {
	const full = "Name:\tnodeagent\nVmPeak:\t  900 kB\nVmHWM:\t   61440 kB\nVmRSS:\t   51200 kB\n" +
		"RssAnon:\t   30720 kB\nRssFile:\t   20480 kB\nRssShmem:\t       0 kB\nThreads:\t9\n"
	tests := []struct {
		name    string
		status  string
		want    procStatus
		wantErr bool
	}{
		{"kB to bytes", full, procStatus{VmRSS: 50 << 20, VmHWM: 60 << 20, RssAnon: 30 << 20, RssFile: 20 << 20}, false},
		{"none", "Name:\tnodeagent\n", procStatus{}, true},
		{"one missing", strings.Replace(full, "RssShmem", "Shmem", 1), procStatus{}, true},
		{"not a number", strings.Replace(full, "51200", "lots", 1), procStatus{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStatus(strings.NewReader(tt.status))
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("parseStatus = %+v, %v; want %+v, error %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestParseInts(t *testing.T) {
	tests := []struct {
		in      string
		want    []int
		wantErr bool
	}{
		{"0", []int{0}, false},
		{"0, 10000,100000", []int{0, 10000, 100000}, false},
		{"", nil, true},
		{"1,-2", nil, true},
		{"1,,2", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseInts(tt.in)
			if (err != nil) != tt.wantErr || !cmp.Equal(got, tt.want) {
				t.Errorf("parseInts(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
			}
		})
	}
}
