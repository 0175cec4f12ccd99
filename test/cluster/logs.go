package cluster

import (
	"flag"
	"io"

	"k8s.io/klog/v2"
)

// QuietLogs keeps the components' klog output (API server, scheduler, device plugins) off
// a test's output unless verbose; call it from TestMain after flag.Parse.
func QuietLogs(verbose bool) {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("stderrthreshold", "FATAL")
	if !verbose {
		klog.SetOutput(io.Discard)
	}
}
