package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/test/cluster"
	"github.com/dynamig/dynamig/test/sandbox"
	"github.com/dynamig/dynamig/test/sandbox/sandboxconfig"
)

// runDemo starts the default world, applies the example pods, waits until they run with
// realised reservations, prints their reservations and the GPUs' occupancy, scales a
// Deployment of GPU pods up and down (scaleDeployment), and stops.
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("dynamig-sandbox demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	examples := fs.String("examples", "examples", "directory of the example pods (*.yaml), applied in file name order")
	timeout := fs.Duration("timeout", 2*time.Minute, "give up when the pods do not run with realised reservations within this time")
	install, kubelet, verbosity := commonFlags(fs)
	if code, ok := parseFlags(fs, args, stderr, "Flags of demo:"); !ok {
		return code
	}
	pods, err := cluster.ReadPods(*examples)
	if err != nil {
		fmt.Fprintf(stderr, "Error: --examples: %v\n", err)
		return exitUsage
	}
	logw := setupLogging(*verbosity, stderr)

	began := time.Now()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	cfg := sandboxconfig.DefaultConfig()
	s, code := startSandbox(ctx, cfg, *install, *kubelet, logw, stderr)
	if s == nil {
		return code
	}
	defer s.Stop()
	fmt.Fprintf(stdout, "Sandbox ready in %s:\n", time.Since(began).Round(10*time.Millisecond))
	for _, n := range s.Nodes() {
		fmt.Fprintf(stdout, "  node %s (%s): %s\n", n.Name, n.Mode, strings.Join(n.GPUs, ", "))
	}
	if err := demo(ctx, s, pods, stdout); err != nil {
		if ctx.Err() != nil && !errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("interrupted: %w", err)
		}
		fmt.Fprintf(stderr, "Error: demo failed: %v\n", err)
		return exitError
	}
	s.Stop()
	fmt.Fprintf(stdout, "\nDemo done in %s; the sandbox stopped cleanly.\n", time.Since(began).Round(10*time.Millisecond))
	return exitOK
}

func demo(ctx context.Context, s *sandbox.Sandbox, pods []*v1.Pod, out io.Writer) error {
	created, err := s.CreatePods(ctx, pods...)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "\nApplied:")
	for i, p := range created {
		scheduler := p.Spec.SchedulerName
		if pods[i].Spec.SchedulerName != scheduler {
			scheduler += " (set by dynamig-webhook)"
		}
		fmt.Fprintf(out, "  pod %s/%s: %s; schedulerName %s\n", p.Namespace, p.Name, describeRequest(p), scheduler)
	}
	// Wait per namespace, all pods at once.
	byNS := map[string][]string{}
	var order []string
	for _, p := range created {
		if _, ok := byNS[p.Namespace]; !ok {
			order = append(order, p.Namespace)
		}
		byNS[p.Namespace] = append(byNS[p.Namespace], p.Name)
	}
	deadline, _ := ctx.Deadline()
	var running []*v1.Pod
	for _, ns := range order {
		ps, err := s.WaitRunning(ctx, time.Until(deadline), ns, byNS[ns]...)
		if err != nil {
			return err
		}
		running = append(running, ps...)
	}

	// Each pod's reservations, checked against the device plugin's instances.
	fmt.Fprintln(out, "\nRunning, with their reservations ("+api.MigReservationsAnnotation+"):")
	instances := map[string][]sandbox.Instance{}
	for _, p := range running {
		fmt.Fprintf(out, "\n%s/%s on %s (bind-phase %s):\n", p.Namespace, p.Name, p.Spec.NodeName, p.Annotations[api.BindPhaseAnnotation])
		raw, ok := p.Annotations[api.MigReservationsAnnotation]
		if !ok {
			fmt.Fprintln(out, "  (no MIG reservation)")
			continue
		}
		fmt.Fprintln(out, prettyJSON(raw))
		recs, err := api.DecodeMigReservations(raw)
		if err != nil {
			return fmt.Errorf("pod %s/%s: %w", p.Namespace, p.Name, err)
		}
		if _, ok := instances[p.Spec.NodeName]; !ok {
			if instances[p.Spec.NodeName], err = s.Instances(p.Spec.NodeName); err != nil {
				return err
			}
		}
		for _, r := range recs {
			if !slices.ContainsFunc(instances[p.Spec.NodeName], func(in sandbox.Instance) bool {
				return in.GPUUUID == r.GPUUUID && in.Placement == r.Placement && in.Profile == r.Profile &&
					r.GPUInstanceID != nil && in.GPUInstanceID == int(*r.GPUInstanceID) && in.PodName == p.Name && in.PodNamespace == p.Namespace
			}) {
				return fmt.Errorf("pod %s/%s: reservation %+v has no matching MIG instance on %s (device plugin reports %v)",
					p.Namespace, p.Name, r, p.Spec.NodeName, instances[p.Spec.NodeName])
			}
		}
	}

	occ, err := s.Occupancy(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "\nGPU occupancy (memory slots):")
	for _, o := range occ {
		fmt.Fprintln(out, "  "+o.String())
	}
	fmt.Fprintln(out, "\nMIG instances the device plugins report (dynamig_mig_instance):")
	for _, n := range s.Nodes() {
		if n.Mode != api.ModeMIG {
			continue
		}
		in, err := s.Instances(n.Name)
		if err != nil {
			return err
		}
		for _, i := range in {
			fmt.Fprintf(out, "  %s %s\n", n.Name, i)
		}
	}
	return scaleDeployment(ctx, s, running, out)
}

// scaleDeployment shows kube-controller-manager's pods taking MIG instances: it deletes the
// examples, then scales a Deployment of one-slice pods (nvidia.com/gpumem 4000: 1g.5gb)
// 1 → 4 → 2, each time waiting until exactly that many replicas run on their own realised
// instances and no deleted pod's instance is left, and prints the A100's occupancy.
func scaleDeployment(ctx context.Context, s *sandbox.Sandbox, examples []*v1.Pod, out io.Writer) error {
	const name = "infer"
	deadline, _ := ctx.Deadline()
	settle := func(replicas int, what string) error {
		if _, err := s.WaitReplicas(ctx, time.Until(deadline), metav1.NamespaceDefault, "app="+name, replicas); err != nil {
			return err
		}
		occ, err := s.Occupancy(ctx)
		if err != nil {
			return err
		}
		for _, o := range occ {
			if len(o.Slots) > 0 {
				fmt.Fprintf(out, "  %-17s %s\n", what+":", o)
			}
		}
		return nil
	}
	for _, p := range examples {
		if err := s.Client().CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "\nThe examples deleted, then a Deployment of one-slice pods (%s) scaled, its pods made by kube-controller-manager:\n", name)
	if err := settle(0, "examples deleted"); err != nil {
		return err
	}
	d := sandbox.MIGDeployment(metav1.NamespaceDefault, name, 1, 4000)
	deployments := s.Client().AppsV1().Deployments(d.Namespace)
	if _, err := deployments.Create(ctx, d, metav1.CreateOptions{}); err != nil {
		return err
	}
	for i, replicas := range []int32{1, 4, 2} {
		if i > 0 {
			patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas)
			if _, err := deployments.Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
				return err
			}
		}
		if err := settle(int(replicas), fmt.Sprintf("replicas %d", replicas)); err != nil {
			return err
		}
	}
	return deployments.Delete(ctx, name, metav1.DeleteOptions{})
}

// describeRequest prints a pod's GPU limits, e.g. "nvidia.com/gpu=2 nvidia.com/gpumem=8000, mode mig".
func describeRequest(p *v1.Pod) string {
	var parts []string
	for _, c := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
		var lim []string
		for name, q := range c.Resources.Limits {
			if strings.HasPrefix(string(name), "nvidia.com/") {
				lim = append(lim, string(name)+"="+strconv.FormatInt(q.Value(), 10))
			}
		}
		slices.Sort(lim)
		if len(lim) > 0 {
			parts = append(parts, c.Name+": "+strings.Join(lim, " "))
		}
	}
	if m := p.Annotations[api.VGPUModeAnnotation]; m != "" {
		parts = append(parts, "mode "+m)
	}
	return strings.Join(parts, ", ")
}
