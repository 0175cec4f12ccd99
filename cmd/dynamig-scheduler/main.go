// Command dynamig-scheduler is kube-scheduler with every default plugin plus DynamicMIG.
// Run it with manifests/scheduler-config.yaml (see manifests/README.md).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/component-base/cli"

	"github.com/dynamig/dynamig/cmd/dynamig-scheduler/app"
)

func main() {
	// The command's context ends on SIGINT/SIGTERM and stops what cmd opened (the metrics
	// listener). kube-scheduler installs its own handler for the scheduler itself; Go
	// delivers each signal to both.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	cmd := app.NewCommand()
	cmd.SetContext(ctx)
	code := cli.Run(cmd)
	stop()
	os.Exit(code)
}
