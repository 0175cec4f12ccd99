// Command probe is the workload of the real-runtime suites: run in a container, it prints as
// one JSON line what the container sees of its GPU devices — its environment's device
// variables, the device nodes under /dev, the mounts — then waits for SIGTERM, or exits at
// once with --exit=<code> (a Job's pod). `probe pause` is the pod sandbox's pause process:
// it waits for SIGTERM. Built static (CGO_ENABLED=0) into the probe image (package images).
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
)

// Report is the line the probe prints.
type Report struct {
	// Env is every variable of the container whose name starts with NVIDIA_, CUDA_ or
	// DYNAMIG_, or is LD_PRELOAD.
	Env map[string]string `json:"env"`
	// Devices are the entries of /dev whose name starts with nvidia, as paths.
	Devices []string `json:"devices"`
	// Mounts are the container's mount points (/proc/self/mountinfo), sorted.
	Mounts []string `json:"mounts"`
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "pause" {
		wait()
		return
	}
	exit := flag.Int("exit", -1, "exit with this code right after the report instead of waiting for SIGTERM")
	flag.Parse()
	if err := json.NewEncoder(os.Stdout).Encode(report()); err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
		os.Exit(2)
	}
	if *exit >= 0 {
		os.Exit(*exit)
	}
	wait()
}

func report() Report {
	r := Report{Env: map[string]string{}, Devices: []string{}, Mounts: []string{}}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "NVIDIA_") || strings.HasPrefix(k, "CUDA_") || strings.HasPrefix(k, "DYNAMIG_") || k == "LD_PRELOAD" {
			r.Env[k] = v
		}
	}
	if entries, err := os.ReadDir("/dev"); err == nil {
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "nvidia") {
				r.Devices = append(r.Devices, "/dev/"+e.Name())
			}
		}
	}
	if f, err := os.Open("/proc/self/mountinfo"); err == nil {
		s := bufio.NewScanner(f)
		for s.Scan() {
			// id parent major:minor root mountpoint options ...
			if fields := strings.Fields(s.Text()); len(fields) > 4 {
				r.Mounts = append(r.Mounts, fields[4])
			}
		}
		f.Close()
		slices.Sort(r.Mounts)
	}
	return r
}

// wait returns on SIGTERM or SIGINT.
func wait() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
}
