package placement

import "fmt"

// coreUsage is what is shared out of a hami-core GPU.
type coreUsage struct {
	shares, memoryMiB, cores int
	exclusive                bool // a share holds every core
}

func (u *coreUsage) add(s Share, devcore int) {
	u.shares++
	u.memoryMiB += s.MemoryMiB
	u.cores += s.Cores
	if devcore > 0 && s.Cores >= devcore {
		u.exclusive = true
	}
}

// fitShare says whether one more share of that size fits, or why not.
func fitShare(g *GPU, u *coreUsage, memoryMiB, cores int) refusal {
	info := &g.Info
	switch {
	case u.shares+1 > info.Count:
		return refusal{reason: ReasonShareLimit, detail: fmt.Sprintf("all %d shares are taken", info.Count)}
	case u.memoryMiB+memoryMiB > info.Devmem:
		return refusal{reason: ReasonShareLimit, detail: fmt.Sprintf("%d of %d MiB free, %d asked", info.Devmem-u.memoryMiB, info.Devmem, memoryMiB)}
	case u.cores+cores > info.Devcore:
		return refusal{reason: ReasonShareLimit, detail: fmt.Sprintf("%d of %d%% cores free, %d asked", info.Devcore-u.cores, info.Devcore, cores)}
	case u.exclusive:
		return refusal{reason: ReasonShareLimit, detail: "held exclusively (gpucores: 100)"}
	case cores >= info.Devcore && info.Devcore > 0 && u.shares > 0:
		return refusal{reason: ReasonShareLimit, detail: "exclusive use (gpucores: 100) needs an unshared GPU"}
	}
	return refusal{}
}

// hamiScore is HAMi's GPU score: 10 × (shares used + cores used + memory used, as fractions).
func hamiScore(g *GPU, u *coreUsage) float64 {
	frac := func(used, total int) float64 {
		if total <= 0 {
			return 0
		}
		return float64(used) / float64(total)
	}
	return 10 * (frac(u.shares, g.Info.Count) + frac(u.cores, g.Info.Devcore) + frac(u.memoryMiB, g.Info.Devmem))
}
