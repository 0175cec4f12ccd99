package packing

import (
	"math"
)

// Paired compares dynamig with one baseline on the same inputs: the mean difference
// (dynamig − baseline) with its standard error, and how often dynamig was better, equal
// or worse.
type Paired struct {
	Mean, SE       float64
	Win, Tie, Loss int
	N              int
	higherIsBetter bool
}

// tieTolerance: differences smaller than this are ties (float noise of equal outcomes).
const tieTolerance = 1e-9

// pair compares a (dynamig) with b (a baseline), input by input; pairs where either is
// NaN are left out.
func pair(a, b []float64, higherIsBetter bool) Paired {
	var d []float64
	p := Paired{higherIsBetter: higherIsBetter}
	for i := range a {
		if math.IsNaN(a[i]) || math.IsNaN(b[i]) {
			continue
		}
		x := a[i] - b[i]
		d = append(d, x)
		switch better := x; {
		case math.Abs(better) <= tieTolerance:
			p.Tie++
		case (better > 0) == higherIsBetter:
			p.Win++
		default:
			p.Loss++
		}
	}
	p.N = len(d)
	var sd float64
	p.Mean, sd = meanSD(d)
	if p.N > 0 {
		p.SE = sd / math.Sqrt(float64(p.N))
	}
	return p
}

// Worse reports whether dynamig is worse than the baseline by more than the standard
// error.
func (p Paired) Worse() bool { return p.WorseBy(1) }

// WorseBy reports whether dynamig is worse than the baseline by more than k standard
// errors.
func (p Paired) WorseBy(k float64) bool {
	if p.higherIsBetter {
		return p.Mean < -k*p.SE-tieTolerance
	}
	return p.Mean > k*p.SE+tieTolerance
}

func meanSD(xs []float64) (mean, sd float64) {
	n := 0
	for _, x := range xs {
		if !math.IsNaN(x) {
			mean += x
			n++
		}
	}
	if n == 0 {
		return math.NaN(), math.NaN()
	}
	mean /= float64(n)
	for _, x := range xs {
		if !math.IsNaN(x) {
			sd += (x - mean) * (x - mean)
		}
	}
	if n > 1 {
		sd = math.Sqrt(sd / float64(n-1))
	}
	return mean, sd
}
