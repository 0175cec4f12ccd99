// Package integration runs the real dynamig-scheduler against an in-process etcd and
// kube-apiserver (test/cluster), with simulated GPU nodes and a stand-in for the device
// plugin.
package integration

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/dynamig/dynamig/test/cluster"
)

// cp is the control plane all tests share; each test has its own namespace, nodes and
// scheduler, and removes its pods and nodes when it ends.
var cp *cluster.ControlPlane

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("skipping the integration tests in -short mode")
		os.Exit(0)
	}
	// The API server and the scheduler log a lot through klog: keep it in a file that is
	// kept (and named on stderr) only when a test fails.
	logDir, err := os.MkdirTemp("", "dynamig-integration-logs-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	logPath := filepath.Join(logDir, "control-plane.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("stderrthreshold", "FATAL")
	klog.SetOutput(logFile)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	start := time.Now()
	cp, err = cluster.StartProcess(ctx, cluster.Options{Log: logFile})
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%v\nlogs: %s\n", err, logPath)
		os.Exit(1)
	}
	fmt.Fprintf(logFile, "control plane started in %s\n", time.Since(start))

	code := m.Run()

	cp.Stop()
	klog.Flush()
	_ = logFile.Close()
	if code == 0 {
		_ = os.RemoveAll(logDir)
	} else {
		fmt.Fprintf(os.Stderr, "control plane and scheduler logs: %s\n", logPath)
	}
	os.Exit(code)
}
