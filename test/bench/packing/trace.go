// Package packing is the placement-quality benchmark (issue 6, part 1): it replays the
// Alibaba GPU-sharing trace (cluster-trace-gpu-v2023) and synthetic churn against the
// real allocator (package placement) and against baselines written here — HAMi v2.10's
// MIG placement as docs/hami-v2.10.md describes it, first-fit, and an exhaustive
// optimum for small static fills — and reports acceptance, utilisation and
// fragmentation.
package packing

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Pod is one GPU task of the trace.
type Pod struct {
	Name string
	// Line is the 1-based line of the CSV file.
	Line int
	// Devices is num_gpu; Milli is gpu_milli (thousandths of one GPU per device).
	Devices, Milli int
	// Arrive and Depart are creation_time and deletion_time in seconds.
	Arrive, Depart float64
}

// Whole reports whether the pod asks for whole devices (gpu_milli 1000, or several GPUs).
func (p Pod) Whole() bool { return p.Milli >= 1000 || p.Devices > 1 }

// LoadTrace reads an openb_pod_list_*.csv file and returns its GPU pods (num_gpu ≥ 1)
// whose deletion comes after their creation, in file order.
func LoadTrace(path string) ([]Pod, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	pods, err := ParseTrace(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return pods, nil
}

// ParseTrace parses the CSV; every error names its line.
func ParseTrace(r io.Reader) ([]Pod, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	var col map[string]int
	var pods []Pod
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(text) == "" {
			continue
		}
		fields := strings.Split(text, ",")
		if col == nil {
			col = map[string]int{}
			for i, name := range fields {
				col[strings.TrimSpace(name)] = i
			}
			for _, need := range []string{"name", "num_gpu", "gpu_milli", "creation_time", "deletion_time"} {
				if _, ok := col[need]; !ok {
					return nil, fmt.Errorf("line %d: header has no column %q", line, need)
				}
			}
			continue
		}
		if len(fields) != len(col) {
			return nil, fmt.Errorf("line %d: %d fields, the header has %d", line, len(fields), len(col))
		}
		num := func(name string) (float64, error) {
			s := strings.TrimSpace(fields[col[name]])
			if s == "" {
				return 0, nil
			}
			v, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return 0, fmt.Errorf("line %d: column %s: %q is not a number", line, name, s)
			}
			return v, nil
		}
		var v [4]float64
		var err error
		for i, name := range []string{"num_gpu", "gpu_milli", "creation_time", "deletion_time"} {
			if v[i], err = num(name); err != nil {
				return nil, err
			}
		}
		p := Pod{Name: fields[col["name"]], Line: line, Devices: int(v[0]), Milli: int(v[1]), Arrive: v[2], Depart: v[3]}
		if p.Devices < 1 || p.Depart <= p.Arrive {
			continue
		}
		if p.Milli < 0 || p.Milli > 1000 {
			return nil, fmt.Errorf("line %d: gpu_milli %d is outside [0, 1000]", line, p.Milli)
		}
		pods = append(pods, p)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("line %d: %w", line+1, err)
	}
	if col == nil {
		return nil, fmt.Errorf("line 1: no header")
	}
	return pods, nil
}
