package kubeletbench

import (
	"io"

	"k8s.io/klog/v2"
)

// The kubelet logs every operation at info level: keep the benchmark
// output to the numbers.
func init() {
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)
}
