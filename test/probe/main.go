// Command probe is the workload of the real-runtime suites: run in a container, it prints as
// one JSON line what the container sees of its GPU devices — its environment's device
// variables, the device nodes under /dev, the mounts — then waits for SIGTERM, or exits at
// once with --exit=<code> (a Job's pod). `probe pause` is the pod sandbox's pause process:
// it waits for SIGTERM. Run as bash (the image that stands in for ubuntu's, where examples
// run `bash -c "sleep …"`), it reports and waits whatever its arguments. Built static
// (CGO_ENABLED=0) into the probe image (package images).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/dynamig/dynamig/test/probe/report"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "pause" {
		wait()
		return
	}
	if filepath.Base(os.Args[0]) == "bash" {
		printReport()
		wait()
		return
	}
	exit := flag.Int("exit", -1, "exit with this code right after the report instead of waiting for SIGTERM")
	flag.Parse()
	printReport()
	if *exit >= 0 {
		os.Exit(*exit)
	}
	wait()
}

// printReport prints what the container sees, one JSON line on stdout.
func printReport() {
	if err := json.NewEncoder(os.Stdout).Encode(report.Collect()); err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
		os.Exit(2)
	}
}

// wait returns on SIGTERM or SIGINT.
func wait() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
}
