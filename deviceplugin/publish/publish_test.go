package publish

import (
	"context"
	"errors"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/nvml/sim"
)

func TestPublishOnlyWhenChanged(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}})
	s, _ := sim.New(sim.Options{Seed: "n"}, sim.GPUSpec{Model: "A100-40GB"})
	s.Init()
	p := &Publisher{Client: client, NodeName: "n", NVML: s, Config: config.DefaultDeviceConfig()}
	if _, wrote, err := p.Publish(ctx); err != nil || !wrote {
		t.Fatalf("first publish: %v %v", wrote, err)
	}
	node, _ := client.CoreV1().Nodes().Get(ctx, "n", metav1.GetOptions{})
	gpus, err := api.DecodeInventory(node.Annotations[api.NodeInventoryAnnotation])
	if err != nil || len(gpus) != 1 || gpus[0].Mode != api.ModeMIG {
		t.Fatalf("published: %+v %v", gpus, err)
	}
	client.ClearActions()
	if _, wrote, err := p.Publish(ctx); err != nil || wrote {
		t.Errorf("unchanged inventory must not be written: %v %v", wrote, err)
	}
	for _, a := range client.Actions() {
		if a.GetVerb() == "patch" {
			t.Errorf("unexpected write: %v", a)
		}
	}
	// A restarted plugin compares with what the Node already carries.
	again := &Publisher{Client: client, NodeName: "n", NVML: s, Config: config.DefaultDeviceConfig()}
	if _, wrote, _ := again.Publish(ctx); wrote {
		t.Error("a restart must not rewrite an equal inventory")
	}
}

func TestHeartbeat(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	h := &Heartbeat{Client: client, NodeName: "n", Namespace: api.DefaultSystemNamespace, Duration: DefaultHeartbeatDuration}
	if err := h.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	first, _ := client.CoordinationV1().Leases(api.DefaultSystemNamespace).Get(ctx, api.HeartbeatLeaseName("n"), metav1.GetOptions{})
	time.Sleep(5 * time.Millisecond)
	if err := h.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	second, _ := client.CoordinationV1().Leases(api.DefaultSystemNamespace).Get(ctx, api.HeartbeatLeaseName("n"), metav1.GetOptions{})
	if *second.Spec.LeaseDurationSeconds != 40 || !second.Spec.RenewTime.After(first.Spec.RenewTime.Time) {
		t.Errorf("lease not renewed: %+v", second.Spec)
	}
}

// TestPublishRepairsTheNodesInventory: the Node's annotation is compared with what the
// plugin would write, not with its own last write, so a value someone else wrote (an
// operator, HAMi's device plugin, which writes the same key) or removed is restored on the
// next publish; an equal one is not written again.
func TestPublishRepairsTheNodesInventory(t *testing.T) {
	for _, tc := range []struct {
		name string
		// other is what someone else does to the Node's annotations between two publishes.
		other     func(annotations map[string]string)
		wantWrite bool
	}{
		{"untouched", func(map[string]string) {}, false},
		{"another key changed", func(a map[string]string) { a["example.com/team"] = "ml" }, false},
		{"rewritten by someone else", func(a map[string]string) { a[api.NodeInventoryAnnotation] = `[{"id":"GPU-other","count":10}]` }, true},
		{"removed", func(a map[string]string) { delete(a, api.NodeInventoryAnnotation) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			client := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}})
			s, _ := sim.New(sim.Options{Seed: "n"}, sim.GPUSpec{Model: "A100-40GB"})
			s.Init()
			p := &Publisher{Client: client, NodeName: "n", NVML: s, Config: config.DefaultDeviceConfig()}
			if _, wrote, err := p.Publish(ctx); err != nil || !wrote {
				t.Fatalf("first publish: %v %v", wrote, err)
			}
			node, _ := client.CoreV1().Nodes().Get(ctx, "n", metav1.GetOptions{})
			want := node.Annotations[api.NodeInventoryAnnotation]
			tc.other(node.Annotations)
			if _, err := client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			client.ClearActions()
			if _, wrote, err := p.Publish(ctx); err != nil || wrote != tc.wantWrite {
				t.Fatalf("publish after the Node was edited: wrote %v, want %v (%v)", wrote, tc.wantWrite, err)
			}
			patches := 0
			for _, a := range client.Actions() {
				if a.GetVerb() == "patch" {
					patches++
				}
			}
			if want := map[bool]int{true: 1, false: 0}[tc.wantWrite]; patches != want {
				t.Errorf("%d patches, want %d", patches, want)
			}
			node, _ = client.CoreV1().Nodes().Get(ctx, "n", metav1.GetOptions{})
			if got := node.Annotations[api.NodeInventoryAnnotation]; got != want {
				t.Errorf("the Node's inventory is %q, want %q", got, want)
			}
			if _, wrote, err := p.Publish(ctx); err != nil || wrote {
				t.Errorf("a repaired inventory must not be written again: %v %v", wrote, err)
			}
		})
	}
}

// TestPublishUnexplainedInstances: the instances no reservation explains are published on
// their GPU; while they cannot be told, nothing is written (issue 14, defect 2).
func TestPublishUnexplainedInstances(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}})
	s, _ := sim.New(sim.Options{Seed: "n"}, sim.GPUSpec{Model: "A100-40GB"})
	s.Init()
	var found map[string][]api.Instance
	var failure error
	p := &Publisher{Client: client, NodeName: "n", NVML: s, Config: config.DefaultDeviceConfig(),
		Unexplained: func(context.Context) (map[string][]api.Instance, error) { return found, failure }}
	failure = errors.New("pods not synced")
	if _, wrote, err := p.Publish(ctx); err == nil || wrote {
		t.Fatalf("publish without knowing the unexplained instances: wrote %v, %v", wrote, err)
	}
	failure = nil
	res, _, err := p.Publish(ctx)
	if err != nil {
		t.Fatal(err)
	}
	gpu := res.GPUs[0].ID
	found = map[string][]api.Instance{gpu: {{Profile: "3g.20gb", Placement: api.Placement{Start: 0, Size: 4}}}}
	if _, wrote, err := p.Publish(ctx); err != nil || !wrote {
		t.Fatalf("a new unexplained instance must be published: %v %v", wrote, err)
	}
	node, _ := client.CoreV1().Nodes().Get(ctx, "n", metav1.GetOptions{})
	gpus, err := api.DecodeInventory(node.Annotations[api.NodeInventoryAnnotation])
	if err != nil || len(gpus[0].Unexplained) != 1 || gpus[0].Unexplained[0].Placement != (api.Placement{Start: 0, Size: 4}) {
		t.Errorf("published %+v, %v", gpus, err)
	}
}
