package app

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/duration"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/inspect"
)

// writeNodes prints each node, then per GPU its slot map (one cell per memory slot, a letter
// per reservation, "." free) with a line per reservation, and the room per profile.
func writeNodes(w io.Writer, nodes []inspect.Node, wide bool, now time.Time) error {
	if len(nodes) == 0 {
		_, err := fmt.Fprintln(w, "No dynamig GPU nodes: no node publishes an inventory (hami.io/node-nvidia-register) or renews a heartbeat.")
		return err
	}
	for i, n := range nodes {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%s  heartbeat %s", n.Name, n.Heartbeat)
		switch n.Heartbeat {
		case "fresh":
			fmt.Fprintf(w, " (for %s)", duration.HumanDuration(n.HeartbeatUntil.Sub(now)))
		case "expired":
			fmt.Fprintf(w, " (%s ago: the scheduler places no GPU pod here)", duration.HumanDuration(now.Sub(n.HeartbeatUntil)))
		}
		switch n.Inventory {
		case "":
		case "missing":
			fmt.Fprint(w, "  inventory missing (the device plugin has not published one)")
		default:
			fmt.Fprintf(w, "  inventory unreadable: %s", n.Inventory)
		}
		fmt.Fprintln(w)
		for _, g := range n.GPUs {
			writeGPU(w, &g, wide)
		}
	}
	return nil
}

func writeGPU(w io.Writer, g *inspect.GPU, wide bool) {
	id := g.ID
	if !wide {
		id = short(id)
	}
	fmt.Fprintf(w, "  GPU %d  %s  %s  %s", g.Index, g.Type, id, g.Mode)
	if g.Mode == api.ModeMIG {
		fmt.Fprintf(w, ", %d slots", g.SlotCount())
	}
	if !g.Health {
		fmt.Fprint(w, ", unhealthy")
	}
	if g.Unusable != "" {
		fmt.Fprintf(w, ", unusable: %s", g.Unusable)
	}
	fmt.Fprintln(w)
	if g.Mode != api.ModeMIG {
		fmt.Fprintf(w, "    shares  %d of %d", len(g.Shares), g.Count)
		mem, cores := 0, 0
		for _, s := range g.Shares {
			mem, cores = mem+s.MemoryMiB, cores+s.Cores
		}
		fmt.Fprintf(w, ", %d of %d MiB, %d of %d%% cores\n", mem, g.Devmem, cores, g.Devcore)
		for _, s := range g.Shares {
			fmt.Fprintf(w, "            %s  %d MiB  %d%%\n", s.Pod, s.MemoryMiB, s.Cores)
		}
		return
	}
	// The map: a cell per slot.
	cells := make([]string, g.SlotCount())
	for i := range cells {
		cells[i] = "."
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	letter := 0
	var legend []string
	for _, s := range g.Slots {
		mark := "."
		if s.Pod != "" {
			mark = string(rune('a' + letter%26))
			letter++
		}
		for c := s.Placement.Start; c < s.Placement.End() && c < len(cells); c++ {
			cells[c] = mark
		}
		if s.Pod == "" {
			legend = append(legend, fmt.Sprintf("%s\t%s\tfree", mark, s.Placement))
			continue
		}
		uuid := s.MIGUUID
		if uuid == "" {
			uuid = "(not created yet)"
		} else if !wide {
			uuid = short(uuid)
		}
		legend = append(legend, fmt.Sprintf("%s\t%s\t%s\t%s\t%s", mark, s.Placement, s.Profile, s.Pod, uuid))
	}
	fmt.Fprintf(w, "    slots  |%s|\n", strings.Join(cells, " "))
	for _, l := range legend {
		fmt.Fprintf(tw, "           %s\n", l)
	}
	tw.Flush()
	var room []string
	for _, r := range g.Room {
		var at []string
		for _, pl := range r.Free {
			at = append(at, pl.String())
		}
		entry := fmt.Sprintf("%s %d", r.Profile, r.More)
		switch {
		case r.More > 0:
			entry += " at " + strings.Join(at, " ")
		case r.Limit != "":
			entry += " (" + r.Limit + ")"
		}
		room = append(room, entry)
	}
	fmt.Fprintf(w, "    room   %s\n", strings.Join(room, "; "))
}

// short is a UUID's prefix and first group: GPU-1e4b6a9d, MIG-6c12db8b.
func short(uuid string) string {
	if i := strings.Index(uuid, "-"); i >= 0 {
		if j := strings.Index(uuid[i+1:], "-"); j >= 0 {
			return uuid[:i+1+j]
		}
	}
	return uuid
}

// writePods prints a row per GPU pod: its node, state, age and devices.
func writePods(w io.Writer, pods []inspect.Pod, namespaces, wide bool, now time.Time) error {
	if len(pods) == 0 {
		_, err := fmt.Fprintln(w, "No GPU pods.")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	if namespaces {
		fmt.Fprint(tw, "NAMESPACE\t")
	}
	fmt.Fprintln(tw, "NAME\tNODE\tSTATE\tAGE\tDEVICES")
	for _, p := range pods {
		if namespaces {
			fmt.Fprintf(tw, "%s\t", p.Namespace)
		}
		node := p.Node
		if node == "" {
			node = "<none>"
		}
		state := p.State
		if p.Reason != "" {
			state += ": " + p.Reason
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", p.Name, node, state, duration.HumanDuration(now.Sub(p.Created)), devices(&p, wide))
	}
	return tw.Flush()
}

// devices lists a pod's devices: MIG reservations as "profile [a,b) GPU MIG-UUID", hami-core
// shares as "GPU memory MiB cores%".
func devices(p *inspect.Pod, wide bool) string {
	id := short
	if wide {
		id = func(s string) string { return s }
	}
	var out []string
	for _, r := range p.Reservations {
		d := fmt.Sprintf("%s %s %s", r.Profile, r.Placement, id(r.GPUUUID))
		if r.MigUUID != "" {
			d += " " + id(r.MigUUID)
		}
		out = append(out, d)
	}
	for _, s := range p.Shares {
		out = append(out, fmt.Sprintf("%s %dMiB %d%%", id(s.UUID), s.MemoryMiB, s.Cores))
	}
	if len(out) == 0 {
		return "-"
	}
	return strings.Join(out, ", ")
}

// model is one row group of `models`: a model of the built-in table and its default allowlist.
type model struct {
	Model     string         `json:"model"`
	NVMLNames []string       `json:"nvmlNames"`
	MemoryMiB int            `json:"memoryMiB"`
	Slots     int            `json:"slots"`
	Confirmed bool           `json:"confirmed"`
	Profiles  []modelProfile `json:"profiles"`
}

type modelProfile struct {
	Name       string          `json:"name"`
	MemoryMiB  int             `json:"memoryMiB"`
	Slices     int             `json:"slices"`
	Instances  int             `json:"instances"`
	Placements []api.Placement `json:"placements"`
	// Allowed: in HAMi v2.10's default allowlist for this model.
	Allowed bool `json:"allowed"`
}

// modelTable is the built-in model table with the default allowlist applied.
func modelTable() []model {
	def := config.DefaultDeviceConfig()
	var out []model
	for _, m := range config.Models() {
		row := model{Model: m.Key, NVMLNames: m.NVMLNames, MemoryMiB: m.MemoryMiB, Slots: m.Slots, Confirmed: m.Confirmed}
		allowed, _ := def.Nvidia.AllowedProfiles(m.NVMLNames[0])
		for _, p := range m.Profiles {
			row.Profiles = append(row.Profiles, modelProfile{Name: p.Name, MemoryMiB: p.MemoryMiB, Slices: p.ParsedName().Slices,
				Instances: p.Instances, Placements: p.Placements.List(), Allowed: contains(allowed, p.Name)})
		}
		out = append(out, row)
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// writeModels prints a row per profile of every model; wide adds the placements.
func writeModels(w io.Writer, models []model, wide bool) error {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	header := "MODEL\tNVML NAME\tPROFILE\tMEMORY(MiB)\tSLICES\tINSTANCES\tDEFAULT ALLOWLIST"
	if wide {
		header += "\tPLACEMENTS"
	}
	fmt.Fprintln(tw, header)
	for _, m := range models {
		for i, p := range m.Profiles {
			name, nvml := m.Model, m.NVMLNames[0]
			if i > 0 {
				name, nvml = "", ""
			}
			allowed := "-"
			if p.Allowed {
				allowed = "yes"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s", name, nvml, p.Name, p.MemoryMiB, p.Slices, p.Instances, allowed)
			if wide {
				var pls []string
				for _, pl := range p.Placements {
					pls = append(pls, pl.String())
				}
				fmt.Fprintf(tw, "\t%s", strings.Join(pls, " "))
			}
			fmt.Fprintln(tw)
		}
	}
	return tw.Flush()
}

// writeExplain prints, per node, whether the pod fits and why not.
func writeExplain(w io.Writer, pod *v1.Pod, source string, verdicts []inspect.Verdict) error {
	fmt.Fprintf(w, "Pod %s/%s", pod.Namespace, pod.Name)
	if pod.Spec.NodeName != "" {
		fmt.Fprintf(w, " (bound to %s; the nodes are judged without it)", pod.Spec.NodeName)
	}
	fmt.Fprintf(w, ", by dynamig's Filter with %s.\nkube-scheduler's own filters (node selectors, affinity, taints, CPU and memory) are not evaluated.\n", source)
	if len(verdicts) == 0 {
		_, err := fmt.Fprintln(w, "No dynamig GPU nodes.")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	fmt.Fprintln(tw, "NODE\tFITS\tWHY")
	for _, v := range verdicts {
		if v.Fits {
			fmt.Fprintf(tw, "%s\tyes\t%s\n", v.Node, strings.Join(v.Devices, "; "))
			continue
		}
		why := v.Reason
		if v.Detail != "" {
			why += ": " + v.Detail
		}
		fmt.Fprintf(tw, "%s\tno\t%s\n", v.Node, why)
	}
	return tw.Flush()
}
