package app

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strconv"
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
func writeNodes(w io.Writer, nodes []inspect.Node, wide bool, now time.Time, pal palette) error {
	if len(nodes) == 0 {
		_, err := fmt.Fprintln(w, "No dynamig GPU nodes: no node publishes an inventory (hami.io/node-nvidia-register) or renews a heartbeat.")
		return err
	}
	for i, n := range nodes {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%s  heartbeat %s", n.Name, pal.paint(n.Heartbeat, stateColour[n.Heartbeat]))
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
	cells, marks := inspect.SlotCells(g.Slots)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	var legend []string
	for _, s := range marks {
		if s.Unexplained {
			legend = append(legend, fmt.Sprintf("%s\t%s\t%s\tno reservation (not dynamig's, or processes still run)", s.Mark, s.Placement, s.Profile))
			continue
		}
		if s.Pod == "" {
			legend = append(legend, fmt.Sprintf("%s\t%s\tfree", s.Mark, s.Placement))
			continue
		}
		uuid := s.MIGUUID
		if uuid == "" {
			uuid = "(not created yet)"
		} else if !wide {
			uuid = short(uuid)
		}
		legend = append(legend, fmt.Sprintf("%s\t%s\t%s\t%s\t%s", s.Mark, s.Placement, s.Profile, s.Pod, uuid))
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
func writePods(w io.Writer, pods []inspect.Pod, namespaces, wide bool, now time.Time, pal palette) error {
	if len(pods) == 0 {
		_, err := fmt.Fprintln(w, "No GPU pods.")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	if namespaces {
		fmt.Fprint(tw, "NAMESPACE\t")
	}
	fmt.Fprintf(tw, "NAME\tNODE\t%s\tAGE\tDEVICES\n", pal.paint("STATE", ""))
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", p.Name, node, pal.paint(state, stateColour[p.State]), duration.HumanDuration(now.Sub(p.Created)), devices(&p, wide))
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
	// InCluster are the cluster's nodes with GPUs of the model (nil: the cluster was not read).
	InCluster []nodeGPUs `json:"inCluster"`
}

// nodeGPUs is how many GPUs of a model a node has.
type nodeGPUs struct {
	Node string `json:"node"`
	GPUs int    `json:"gpus"`
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
	header := "MODEL\tNVML NAME\tIN CLUSTER\tPROFILE\tMEMORY(MiB)\tSLICES\tINSTANCES\tDEFAULT ALLOWLIST"
	if wide {
		header += "\tPLACEMENTS"
	}
	fmt.Fprintln(tw, header)
	for _, m := range models {
		for i, p := range m.Profiles {
			name, nvml, in := m.Model, m.NVMLNames[0], inCluster(m.InCluster)
			if i > 0 {
				name, nvml, in = "", "", ""
			}
			allowed := "-"
			if p.Allowed {
				allowed = "yes"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s", name, nvml, in, p.Name, p.MemoryMiB, p.Slices, p.Instances, allowed)
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

// inCluster is "-" for a model no node has, "?" when the cluster was not read, else the
// GPUs and nodes: "9 on 2 nodes".
func inCluster(in []nodeGPUs) string {
	if in == nil {
		return "?"
	}
	if len(in) == 0 {
		return "-"
	}
	gpus := 0
	for _, n := range in {
		gpus += n.GPUs
	}
	if len(in) == 1 {
		return fmt.Sprintf("%d on %s", gpus, in[0].Node)
	}
	return fmt.Sprintf("%d on %d nodes", gpus, len(in))
}

// writeExplain prints, per GPU node, whether the pod fits and why not, the other nodes'
// reasons counted, then for each node other pods block what stands in the way.
func writeExplain(w io.Writer, pod *v1.Pod, source string, e *inspect.Explanation, pal palette) error {
	fmt.Fprintf(w, "Pod %s/%s", pod.Namespace, pod.Name)
	if pod.Spec.NodeName != "" {
		fmt.Fprintf(w, " (bound to %s; the nodes are judged without it)", pod.Spec.NodeName)
	}
	fmt.Fprintf(w, ", by the scheduler's filters with %s.\n", source)
	if e.Refusal != "" {
		_, err := fmt.Fprintf(w, "The scheduler refuses it before it looks at any node: %s.\n", e.Refusal)
		return err
	}
	fmt.Fprintln(w, notEvaluated)
	verdicts := e.Nodes
	var others []inspect.Verdict
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	fmt.Fprintf(tw, "NODE\t%s\tWHY\n", pal.paint("FITS", ""))
	for _, v := range verdicts {
		if !v.GPUNode {
			others = append(others, v)
			continue
		}
		if v.Fits {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", v.Node, pal.paint("yes", green), strings.Join(v.Devices, "; "))
			continue
		}
		why := v.Reason
		if v.Detail != "" {
			why += ": " + v.Detail
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", v.Node, pal.paint("no", red), why)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(others) > 0 {
		fmt.Fprintf(w, "%d node(s) without dynamig's device plugin: %s.\n", len(others), countReasons(others))
	}
	for _, v := range verdicts {
		if len(v.Layout) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s:\n", v.Node)
		for _, l := range v.Layout {
			fmt.Fprintf(w, "  %s\n", l)
		}
		switch {
		case len(v.FitsWithout) == 0:
			fmt.Fprintln(w, "  no one pod's or two pods' ending would make room")
		case len(v.FitsWithout[0]) == 1:
			fmt.Fprintf(w, "  fits once one of these ends: %s\n", joinSets(v.FitsWithout))
		default:
			fmt.Fprintf(w, "  fits once both pods of one of these pairs end: %s\n", joinSets(v.FitsWithout))
		}
		if len(v.Relocation) > 0 {
			fmt.Fprintf(w, "  relocation would move: %s\n", strings.Join(v.Relocation, ", "))
		}
	}
	return nil
}

// notEvaluated names kube-scheduler's filters explain and simulate cannot tell from the objects.
const notEvaluated = "Not evaluated: kube-scheduler's inter-pod affinity, topology spread, volume and port filters, and nominated pods."

func joinSets(sets [][]string) string {
	out := make([]string, len(sets))
	for i, s := range sets {
		out[i] = strings.Join(s, " and ")
	}
	return strings.Join(out, "; ")
}

// countReasons counts the verdicts' reasons as the scheduler's Pending event does: "2 node(s)
// were unschedulable, 1 …", in reason order.
func countReasons(verdicts []inspect.Verdict) string {
	counts := map[string]int{}
	for _, v := range verdicts {
		counts[v.Reason]++
	}
	return formatCounts(counts)
}

func formatCounts(counts map[string]int) string {
	reasons := make([]string, 0, len(counts))
	for r := range counts {
		reasons = append(reasons, r)
	}
	slices.Sort(reasons)
	for i, r := range reasons {
		reasons[i] = fmt.Sprintf("%d %s", counts[r], r)
	}
	return strings.Join(reasons, ", ")
}

// writeLandings prints where each simulated pod lands.
func writeLandings(w io.Writer, landings []inspect.Landing, where, source string, wide bool, pal palette) error {
	fmt.Fprintf(w, "Placing %d pod(s) on %s, with %s.\n%s\n", len(landings), where, source, notEvaluated)
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	fmt.Fprintf(tw, "POD\t%s\tCLOSE\tDEVICES\n", pal.paint("NODE", ""))
	for _, l := range landings {
		switch {
		case l.Refusal != "":
			fmt.Fprintf(tw, "%s\t%s\t-\trefused before any node: %s\n", l.Pod, pal.paint("<none>", red), l.Refusal)
		case l.Skipped != "":
			fmt.Fprintf(tw, "%s\t%s\t-\tskipped: %s\n", l.Pod, pal.paint("-", yellow), l.Skipped)
		case l.Node == "":
			total := 0
			for _, n := range l.Refusals {
				total += n
			}
			fmt.Fprintf(tw, "%s\t%s\t-\t0/%d nodes are available: %s\n", l.Pod, pal.paint("<none>", red), total, formatCounts(l.Refusals))
		default:
			devs := l.Devices
			if !wide {
				devs = make([]string, len(l.Devices))
				for i, d := range l.Devices {
					devs[i] = shortUUIDs(d)
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", l.Pod, pal.paint(l.Node, green), cmp.Or(strings.Join(l.Close, ","), "-"), strings.Join(devs, "; "))
		}
	}
	return tw.Flush()
}

// shortUUIDs shortens every GPU-/MIG- UUID in s.
func shortUUIDs(s string) string {
	fields := strings.Fields(s)
	for i, f := range fields {
		if strings.HasPrefix(f, "GPU-") || strings.HasPrefix(f, "MIG-") {
			fields[i] = short(f)
		}
	}
	return strings.Join(fields, " ")
}

// palette paints table cells with ANSI colours when the output is a terminal. Every code is
// five bytes and every painted column is painted in every row, its header included, so
// tabwriter's byte-counted columns stay aligned.
type palette bool

const (
	green  = "\x1b[32m"
	red    = "\x1b[31m"
	yellow = "\x1b[33m"
	plain  = "\x1b[39m"
	reset  = "\x1b[0m"
)

// stateColour colours heartbeats and pod states.
var stateColour = map[string]string{"fresh": green, "expired": red, "missing": red,
	"realised": green, "reserved": yellow, "pending": yellow, "failed": red}

func (p palette) paint(s, colour string) string {
	if !p {
		return s
	}
	if colour == "" {
		colour = plain
	}
	return colour + s + reset
}

// writeQuotas prints the namespaces' GPU quota use, one line per quota and resource.
func writeQuotas(w io.Writer, rows []inspect.QuotaUse, pal palette) error {
	if len(rows) == 0 {
		_, err := fmt.Fprintln(w, "No GPU quotas, and no namespace is granted GPU memory or cores.")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	fmt.Fprintf(tw, "NAMESPACE\tQUOTA\tRESOURCE\t%s\tLIMIT\n", pal.paint("USED", ""))
	for _, r := range rows {
		name, limit, colour := r.Quota, "<none>", ""
		if name == "" {
			name = "<none>"
		}
		if r.Limit != nil {
			limit = strconv.FormatInt(*r.Limit, 10)
			if r.Used >= *r.Limit {
				colour = red // full: the next GPU pod of the namespace waits
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Namespace, name, r.Resource, pal.paint(strconv.FormatInt(r.Used, 10), colour), limit)
	}
	return tw.Flush()
}
