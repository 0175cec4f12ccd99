// Package burst measures a burst of GPU pods to one node: how long from the device plugin's
// first GPU-instance create to the last pod Running, on the whole sandbox (the real
// kube-apiserver, dynamig-scheduler, device plugin and kubelet, simulated NVML whose creates
// take Config.CreateLatency each and take turns per GPU). It is the figure the hand-off
// design is judged by: with the hand-off Lease (LeaseBaseline, the "before" figure) one node
// realised one GPU pod at a time; without it the device plugin realises each container at
// PreStartContainer, finding it through the kubelet's PodResources API, and only creates on
// the same GPU take turns.
package burst

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/test/sandbox"
	"github.com/dynamig/dynamig/test/sandbox/sandboxconfig"
)

// Config is one burst.
type Config struct {
	// Install is the install manifest (manifests/install.yaml).
	Install string
	// Model and GPUs make the node; Pods each ask for one MIG device of MemoryMiB.
	Model     string
	GPUs      int
	Pods      int
	MemoryMiB int
	// CreateLatency is each GPU-instance create's time.
	CreateLatency time.Duration
	// Timeout bounds the wait for the pods, from their creation.
	Timeout time.Duration
}

// Result is what one burst measured.
type Result struct {
	Config Config
	// FirstCreate is the device plugin's first GPU-instance create; Running[i] is when pod i
	// was first seen Running with its reservation realised, in the order they were.
	FirstCreate time.Time
	Running     []time.Time
	// Elapsed is from FirstCreate to the last pod Running.
	Elapsed time.Duration
	// Profiles counts the realised instances by profile.
	Profiles map[string]int
}

const node = "burst"

// Run starts a sandbox of one mig node, creates every pod at once and waits until all run.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	gpus := make([]string, cfg.GPUs)
	for i := range gpus {
		gpus[i] = cfg.Model
	}
	sb, err := sandbox.Start(ctx, sandbox.Options{
		Config:  sandboxconfig.Config{Nodes: []sandboxconfig.NodeConfig{{Name: node, Mode: api.ModeMIG, GPUs: gpus}}},
		Install: cfg.Install, CreateLatency: cfg.CreateLatency,
	})
	if err != nil {
		return nil, err
	}
	defer sb.Stop()
	client := sb.Client()
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()

	// Each pod's first moment Running with its instance realised, from a watch.
	var mu sync.Mutex
	running := map[string]time.Time{}
	allRunning := make(chan struct{})
	observe := func(obj any) {
		p, ok := obj.(*v1.Pod)
		if !ok || p.Status.Phase != v1.PodRunning || p.Annotations[api.BindPhaseAnnotation] != api.BindPhaseSuccess {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if _, seen := running[p.Name]; !seen {
			running[p.Name] = time.Now()
			if len(running) == cfg.Pods {
				close(allRunning)
			}
		}
	}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(metav1.NamespaceDefault))
	informer := factory.Core().V1().Pods().Informer()
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: observe, UpdateFunc: func(_, obj any) { observe(obj) }}); err != nil {
		return nil, err
	}
	stop := make(chan struct{})
	factory.Start(stop)
	defer factory.Shutdown() // after close(stop), which the informers wait for
	defer close(stop)
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		return nil, fmt.Errorf("the pod informer did not sync")
	}

	for i := range cfg.Pods {
		p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("burst-%02d", i), Namespace: metav1.NamespaceDefault,
			Annotations: map[string]string{api.VGPUModeAnnotation: api.ModeMIG}},
			Spec: v1.PodSpec{SchedulerName: api.DefaultSchedulerName, Containers: []v1.Container{{Name: "main", Image: "busybox",
				Resources: v1.ResourceRequirements{Limits: v1.ResourceList{
					api.ResourceCount:  resource.MustParse("1"),
					api.ResourceMemory: *resource.NewQuantity(int64(cfg.MemoryMiB), resource.DecimalSI)}}}}}}
		if _, err := client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
	}
	select {
	case <-allRunning:
	case <-ctx.Done():
		mu.Lock()
		n := len(running)
		mu.Unlock()
		return nil, fmt.Errorf("%d of %d pods running after %s", n, cfg.Pods, cfg.Timeout)
	}

	res := &Result{Config: cfg, FirstCreate: sb.FirstInstanceCreate(node), Profiles: map[string]int{}}
	mu.Lock()
	for _, t := range running {
		res.Running = append(res.Running, t)
	}
	mu.Unlock()
	slices.SortFunc(res.Running, func(a, b time.Time) int { return a.Compare(b) })
	res.Elapsed = res.Running[len(res.Running)-1].Sub(res.FirstCreate)
	instances, err := sb.Instances(node)
	if err != nil {
		return nil, err
	}
	for _, in := range instances {
		res.Profiles[in.Profile]++
	}
	return res, nil
}
