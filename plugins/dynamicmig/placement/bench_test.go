package placement

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/dynamig/dynamig/api"
)

// benchNode is an 8-GPU A100-40GB node with a realistic part of it reserved.
func benchNode(b *testing.B, rng *rand.Rand) []GPU {
	models := make([]string, 8)
	for i := range models {
		models[i] = "A100-40GB"
	}
	gpus := inventoryOf(b, "", "", models...)
	for i := range gpus {
		gpus[i].Info.Index = uint(i)
	}
	for pod := 0; pod < 20; pod++ {
		if res, why := Fit(gpus, migPod(1, 1+rng.IntN(20000)), defaultOpts); why == nil {
			reserve(gpus, res)
		}
	}
	return gpus
}

// BenchmarkFitNode8GPUs is Filter's work on one node: a 2-device pod on 8 partly used GPUs.
func BenchmarkFitNode8GPUs(b *testing.B) {
	gpus := benchNode(b, rand.New(rand.NewPCG(1, 1)))
	req := migPod(2, 8000)
	b.ReportAllocs()
	for b.Loop() {
		if _, why := Fit(gpus, req, defaultOpts); why != nil {
			b.Fatal(why)
		}
	}
}

// BenchmarkFitPass1000Nodes is one scheduling cycle's Filter over 1,000 such nodes.
func BenchmarkFitPass1000Nodes(b *testing.B) {
	rng := rand.New(rand.NewPCG(2, 2))
	template := benchNode(b, rng)
	nodes := make([][]GPU, 1000)
	for n := range nodes {
		nodes[n] = make([]GPU, len(template))
		for i := range template {
			nodes[n][i] = GPU{Info: template[i].Info}
			// Vary occupancy per node: keep a random prefix of the template's reservations.
			mig := template[i].MIG
			nodes[n][i].MIG = mig[:rng.IntN(len(mig)+1)]
		}
	}
	req := &Request{Mode: api.ModeMIG, Containers: []ContainerRequest{{Devices: 1, MemoryMiB: 8000}}}
	b.ReportAllocs()
	for b.Loop() {
		fits := 0
		for _, gpus := range nodes {
			if _, why := Fit(gpus, req, defaultOpts); why == nil {
				fits++
			}
		}
		if fits == 0 {
			b.Fatal("no node fits")
		}
	}
}

// BenchmarkFitNode8GPUsMaxSelectors is BenchmarkFitNode8GPUs with every selector annotation
// at request.Parse's bounds (64 types, 1024 UUIDs), the node's own GPUs matching last: what
// one node's Filter costs at worst from the selectors.
func BenchmarkFitNode8GPUsMaxSelectors(b *testing.B) {
	gpus := benchNode(b, rand.New(rand.NewPCG(1, 1)))
	req := migPod(2, 8000)
	// UUIDs as long as real ones, so that no comparison stops at the length.
	uuid := func(i int) string { return fmt.Sprintf("GPU-00000000-0000-0000-0000-%012d", i) }
	for i := range 1024 {
		req.NoUseUUIDs = append(req.NoUseUUIDs, uuid(i))
		if i < 1024-len(gpus) {
			req.UseUUIDs = append(req.UseUUIDs, uuid(i))
		}
	}
	for i := range gpus {
		req.UseUUIDs = append(req.UseUUIDs, gpus[i].Info.ID)
	}
	for i := range 64 {
		req.NoUseTypes = append(req.NoUseTypes, fmt.Sprintf("h%03d", i))
		if i < 63 {
			req.UseTypes = append(req.UseTypes, fmt.Sprintf("b%03d", i))
		}
	}
	req.UseTypes = append(req.UseTypes, "a100")
	slices.Sort(req.UseUUIDs) // as request.Parse leaves them
	b.ReportAllocs()
	for b.Loop() {
		if _, why := Fit(gpus, req, defaultOpts); why != nil {
			b.Fatal(why)
		}
	}
}
