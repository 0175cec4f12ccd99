// Package report is what the probe (test/probe) prints from inside a container, and what
// the tests read back: one definition for both.
package report

import (
	"bufio"
	"os"
	"slices"
	"strings"
)

// Report is the line the probe prints, as JSON.
type Report struct {
	// Env is every variable of the container whose name starts with NVIDIA_, CUDA_ or
	// DYNAMIG_, or is LD_PRELOAD.
	Env map[string]string `json:"env"`
	// Devices are the entries of /dev whose name starts with nvidia, as paths.
	Devices []string `json:"devices"`
	// Mounts are the container's mount points (/proc/self/mountinfo), sorted.
	Mounts []string `json:"mounts"`
}

// Collect is the Report of the calling process's container.
func Collect() Report {
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
