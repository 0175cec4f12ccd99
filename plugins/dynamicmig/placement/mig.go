package placement

import (
	"cmp"
	"fmt"
	"math/bits"
	"slices"
	"strings"
	"sync"

	"github.com/dynamig/dynamig/api"
)

// maxProfiles bounds the profiles a GPU can publish; NVML has 18 GPU-instance profiles.
const maxProfiles = 24

// slotMask is a set of memory slots; 32 bits hold every GPU (8, 4 or 12 slots).
type slotMask uint32

func maskOf(p api.Placement) slotMask {
	if p.Start < 0 || p.Size <= 0 || p.End() > 32 {
		return 0
	}
	return slotMask((uint64(1)<<uint(p.Size) - 1) << uint(p.Start))
}

// migProfile is one published profile prepared for fitting.
type migProfile struct {
	pub    *api.MigProfile
	name   api.ProfileName
	slices int
	size   int // slots one placement spans
	masks  []slotMask
	// hamiDescending is HAMi's placement order: highest start first for 1g and 3g.
	hamiDescending bool
}

// migGPU is the static part of one MIG GPU: its profiles as slot masks. It is built once per
// published inventory (see prepared) and only read afterwards.
type migGPU struct {
	slots      int
	fullMiB    int // the full-GPU profile's memory: a device of a request that names no memory
	all        slotMask
	maxGIs     int // 0: no limit published
	fullSlices int
	profiles   []migProfile // as published: by memory, then slices
	// byShare orders the profiles' indexes for a share of the GPU (shareDemand): by the
	// memory slots they span, then the most compute first. A demand in MiB takes profiles.
	byShare []int
}

// migUsage is what is placed on a MIG GPU; a value, copied to evaluate a candidate.
type migUsage struct {
	used     slotMask
	count    [maxProfiles]uint8
	gis      int
	slices   int
	me       int // "+me" GIs
	allME    int // "+me.all" GIs
	notMinus int // GIs other than "-me" ones
}

// preparedKey identifies a published inventory entry: the plugin decodes each node's
// annotation once, so its profile array is shared by every Filter call until it changes.
type preparedKey struct {
	profiles             *api.MigProfile
	n, count, slots, mem int
}

// prepared caches migGPUs; it is dropped whole when it grows past maxPrepared, which a
// cluster reaches only through many inventory changes.
var (
	preparedMu sync.RWMutex
	prepared   = map[preparedKey]*migGPU{}
)

const maxPrepared = 1 << 16

// preparedMIGGPU returns the static part of a MIG GPU, built once per inventory.
func preparedMIGGPU(info *api.GPU) *migGPU {
	if len(info.MigProfiles) == 0 {
		return newMIGGPU(info)
	}
	key := preparedKey{profiles: &info.MigProfiles[0], n: len(info.MigProfiles), count: info.Count, slots: info.SlotCount(), mem: info.Devmem}
	preparedMu.RLock()
	g, ok := prepared[key]
	preparedMu.RUnlock()
	if ok {
		return g
	}
	g = newMIGGPU(info)
	preparedMu.Lock()
	if len(prepared) >= maxPrepared {
		prepared = map[preparedKey]*migGPU{}
	}
	prepared[key] = g
	preparedMu.Unlock()
	return g
}

func newMIGGPU(info *api.GPU) *migGPU {
	g := &migGPU{slots: info.SlotCount(), maxGIs: info.Count}
	g.all = slotMask(uint64(1)<<uint(min(g.slots, 32)) - 1)
	for i := range info.MigProfiles {
		if i == maxProfiles {
			break
		}
		pub := &info.MigProfiles[i]
		name, err := api.ParseProfileName(pub.Name)
		if err != nil {
			continue // the inventory decoder refuses these; be safe with hand-made ones
		}
		p := migProfile{pub: pub, name: name, slices: max(pub.SliceCount, name.Slices),
			hamiDescending: name.Slices == 1 || name.Slices == 3}
		for _, pl := range pub.Placements {
			if m := maskOf(pl); m != 0 && pl.End() <= g.slots {
				p.masks = append(p.masks, m)
				p.size = pl.Size
			}
		}
		// Compute slices are bounded by the full-GPU profile's; when the allowlist hides it,
		// the legal placements already keep the sum within it (A100: 4g@0 + 3g@4 = 7).
		if p.size == g.slots && name.Variant == "" {
			g.fullSlices = max(g.fullSlices, p.slices)
		}
		if p.size == g.slots && name.Variant == "" {
			g.fullMiB = max(g.fullMiB, pub.MemoryMB)
		}
		g.profiles = append(g.profiles, p)
	}
	if g.fullMiB == 0 {
		g.fullMiB = info.Devmem
	}
	// Smallest first: memory, then slices, then plain before variants, which take engines
	// that other instances may need.
	slices.SortStableFunc(g.profiles, func(a, b migProfile) int {
		return cmp.Or(cmp.Compare(a.pub.MemoryMB, b.pub.MemoryMB), cmp.Compare(a.slices, b.slices),
			cmp.Compare(variantRank[a.name.Variant], variantRank[b.name.Variant]))
	})
	for i := range g.profiles {
		g.byShare = append(g.byShare, i)
	}
	slices.SortStableFunc(g.byShare, func(a, b int) int {
		pa, pb := &g.profiles[a], &g.profiles[b]
		return cmp.Or(cmp.Compare(pa.size, pb.size), cmp.Compare(pb.slices, pa.slices), cmp.Compare(pa.pub.MemoryMB, pb.pub.MemoryMB))
	})
	return g
}

var variantRank = map[string]int{"": 0, "-me": 1, "+gfx": 2, "+me": 3, "+me.all": 4}

// profileIndex finds a published profile by name, -1 if it is not published.
func (g *migGPU) profileIndex(name string) int {
	for i := range g.profiles {
		if g.profiles[i].pub.Name == name {
			return i
		}
	}
	return -1
}

// add records an instance of the named profile at pl. Reservations of profiles the GPU no
// longer publishes (an allowlist change) still occupy their slots and slices.
func (g *migGPU) add(u *migUsage, name string, pl api.Placement) {
	u.used |= maskOf(pl)
	u.gis++
	i := g.profileIndex(name)
	var pn api.ProfileName
	var err error
	if i >= 0 {
		pn = g.profiles[i].name
	} else {
		pn, err = api.ParseProfileName(name)
	}
	if err == nil {
		u.slices += pn.Slices
		switch pn.Variant {
		case "+me":
			u.me++
		case "+me.all":
			u.allME++
		}
		if pn.Variant != "-me" {
			u.notMinus++
		}
	}
	if i >= 0 && u.count[i] < 255 {
		u.count[i]++
	}
}

// placeable reports whether one more instance of profile i is allowed by the instance
// counts, compute slices and media-engine rules, ignoring where it goes. It is the hot path
// of the fragmentation cost, so it formats nothing; limit says which rule refused.
func (g *migGPU) placeable(u *migUsage, i int) bool { return g.rule(u, i) == ruleNone }

// rule is the first rule that forbids one more instance of profile i.
type rule int

const (
	ruleNone rule = iota
	ruleProfileCount
	ruleGPUCount
	ruleSlices
	ruleMediaEngines
	ruleAllMediaEngines
	ruleBesideAllME
)

func (g *migGPU) rule(u *migUsage, i int) rule {
	p := &g.profiles[i]
	switch {
	case p.pub.Instances > 0 && int(u.count[i]) >= p.pub.Instances:
		return ruleProfileCount
	case g.maxGIs > 0 && u.gis >= g.maxGIs:
		return ruleGPUCount
	case g.fullSlices > 0 && u.slices+p.slices > g.fullSlices:
		return ruleSlices
	}
	switch p.name.Variant {
	case "+me":
		if u.me > 0 || u.allME > 0 {
			return ruleMediaEngines
		}
	case "+me.all":
		if u.notMinus > 0 {
			return ruleAllMediaEngines
		}
	case "-me":
	default:
		if u.allME > 0 {
			return ruleBesideAllME
		}
	}
	return ruleNone
}

// limit says which rule forbids one more instance of profile i, "" if none does.
func (g *migGPU) limit(u *migUsage, i int) string {
	p := &g.profiles[i]
	switch g.rule(u, i) {
	case ruleProfileCount:
		return fmt.Sprintf("%s has its %d instances", p.pub.Name, p.pub.Instances)
	case ruleGPUCount:
		return fmt.Sprintf("the GPU has its %d MIG instances", g.maxGIs)
	case ruleSlices:
		return fmt.Sprintf("%s needs %d compute slices and %d of %d are free", p.pub.Name, p.slices, g.fullSlices-u.slices, g.fullSlices)
	case ruleMediaEngines:
		return fmt.Sprintf("%s needs the media engines another instance holds", p.pub.Name)
	case ruleAllMediaEngines:
		return fmt.Sprintf("%s needs every media engine and other instances hold some", p.pub.Name)
	case ruleBesideAllME:
		return "a +me.all instance holds every media engine; only -me profiles fit beside it"
	}
	return ""
}

// capacity is how many more instances of profile i fit. A profile's legal placements are
// disjoint on every GPU of the facts file, so counting free ones is exact; overlapping
// placement lists are counted greedily.
func (g *migGPU) capacity(u *migUsage, i int) int {
	p := &g.profiles[i]
	if !g.placeable(u, i) {
		return 0
	}
	n, taken := 0, u.used
	for _, m := range p.masks {
		if m&taken == 0 {
			n++
			taken |= m
		}
	}
	if p.pub.Instances > 0 {
		n = min(n, p.pub.Instances-int(u.count[i]))
	}
	if g.maxGIs > 0 {
		n = min(n, g.maxGIs-u.gis)
	}
	return n
}

// deadSlots counts free slots that no placeable profile can cover any more.
func (g *migGPU) deadSlots(u *migUsage) int {
	covered := u.used
	for i := range g.profiles {
		if !g.placeable(u, i) {
			continue
		}
		for _, m := range g.profiles[i].masks {
			if m&u.used == 0 {
				covered |= m
			}
		}
	}
	return bits.OnesCount32(uint32(g.all &^ covered))
}

// weightedCapacity is Σ capacity × slots per placement over every profile: how much the GPU
// can still host, larger profiles counting more.
func (g *migGPU) weightedCapacity(u *migUsage) int {
	total := 0
	for i := range g.profiles {
		total += g.capacity(u, i) * g.profiles[i].size
	}
	return total
}

// cost is the fragmentation cost of placing profile i at placement j: the weighted capacity
// lost plus the slots it leaves dead, each weighted as the loss of a full GPU's capacity
// (a dead slot is wasted for as long as its neighbours live).
func (g *migGPU) cost(u *migUsage, i, j int) int {
	after := *u
	after.used |= g.profiles[i].masks[j]
	after.count[i]++
	after.gis++
	after.slices += g.profiles[i].slices
	switch g.profiles[i].name.Variant {
	case "+me":
		after.me++
	case "+me.all":
		after.allME++
	}
	if g.profiles[i].name.Variant != "-me" {
		after.notMinus++
	}
	dead := g.deadSlots(&after) - g.deadSlots(u)
	lost := g.weightedCapacity(u) - g.weightedCapacity(&after)
	return dead*deadSlotWeight(g.slots) + lost
}

// deadSlotWeight is the cost of one dead slot: as much as the full-GPU profile's capacity.
func deadSlotWeight(slots int) int { return slots }

// migChoice is a candidate for one device on one MIG GPU.
type migChoice struct {
	profile   int
	placement int
	cost      int
}

// migDemand is one device's need, resolved against this GPU.
type migDemand struct {
	memoryMiB int
	cores     int
	// slots is the least number of memory slots the profile spans (a memory percentage).
	slots int
}

// choose picks the profile and placement for one device, or says why none fits. With
// fragmentation off the cost is ignored and HAMi's order decides.
//
// Details are formatted only with explain: Filter runs this for every GPU of every node,
// and only a device that fits nowhere needs them.
func (g *migGPU) choose(u *migUsage, d migDemand, fragmentationAware, explain bool) (migChoice, refusal) {
	detail := func(format string, args ...any) string {
		if !explain {
			return ""
		}
		return fmt.Sprintf(format, args...)
	}
	var why refusal
	bigEnough := false
	for i := range g.profiles {
		if d.slots > 0 {
			i = g.byShare[i]
		}
		p := &g.profiles[i]
		if p.pub.MemoryMB < d.memoryMiB || p.pub.Core < d.cores || p.size < d.slots || len(p.masks) == 0 {
			continue
		}
		bigEnough = true
		limited := !g.placeable(u, i)
		best := migChoice{profile: i, placement: -1}
		for k := range p.masks {
			j := k
			if p.hamiDescending {
				j = len(p.masks) - 1 - k
			}
			if p.masks[j]&u.used != 0 {
				continue
			}
			if limited {
				best.placement = -2 // free placements exist; a limit forbids them
				break
			}
			c := 0
			if fragmentationAware {
				c = g.cost(u, i, j)
			}
			if best.placement < 0 || c < best.cost {
				best.placement, best.cost = j, c
			}
		}
		if best.placement >= 0 {
			return best, refusal{}
		}
		if best.placement == -2 {
			r := refusal{reason: ReasonInstanceLimit}
			if explain {
				r.detail = g.limit(u, i)
			}
			why = why.closer(r)
			continue
		}
		// Fragmented: the free slots this profile could use add up to a placement, but no
		// legal placement is wholly free.
		var reach slotMask
		for _, m := range p.masks {
			reach |= m
		}
		free := bits.OnesCount32(uint32(reach &^ u.used))
		if free >= p.size {
			why = why.closer(refusal{reason: ReasonFragmented, detail: detail("%s needs %d slots and %d are free, but not at a legal placement", p.pub.Name, p.size, free)})
		} else {
			why = why.closer(refusal{reason: ReasonPlacementsTaken, detail: detail("every placement of %s is taken", p.pub.Name)})
		}
	}
	if !bigEnough {
		r := refusal{reason: ReasonNoProfile}
		if explain {
			if d.slots > 0 {
				r.detail = fmt.Sprintf("no allowlisted profile spans %d of the %d memory slots with %d%% of the cores (largest: %s)", d.slots, g.slots, d.cores, g.largestProfile())
			} else {
				r.detail = fmt.Sprintf("no allowlisted profile has %d MiB and %d%% of the cores (largest: %s)", d.memoryMiB, d.cores, g.largestProfile())
			}
		}
		return migChoice{}, r
	}
	return migChoice{}, why
}

func (g *migGPU) largestProfile() string {
	if len(g.profiles) == 0 {
		return "none published"
	}
	p := g.profiles[len(g.profiles)-1].pub
	return fmt.Sprintf("%s, %d MiB, %d%% cores", p.Name, p.MemoryMB, p.Core)
}

// shareDemand is a device of percent of the GPU: a profile that spans at least that share of
// its memory slots (50 % of 8: 4), the smallest span first and within a span the most compute
// first (choose, byShare): on an A100-40GB 50 % is a 4g.20gb, or a 3g.20gb where the allowlist
// has no 4g (HAMi's default) or the 4g has no room, and 25 % a 2g.10gb before a 1g.10gb. cores
// is the container's own.
func (g *migGPU) shareDemand(percent, cores int) migDemand {
	return migDemand{slots: (percent*g.slots + 99) / 100, cores: cores}
}

// fullMemory is the memory of the full-GPU profile, which a request naming no memory asks.
func (g *migGPU) fullMemory() int { return g.fullMiB }

// utilisation is the share of memory slots in use, in [0,1].
func (g *migGPU) utilisation(u *migUsage) float64 {
	if g.slots == 0 {
		return 1
	}
	return float64(bits.OnesCount32(uint32(u.used&g.all))) / float64(g.slots)
}

func (u *migUsage) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "used=%b gis=%d slices=%d", u.used, u.gis, u.slices)
	return b.String()
}
