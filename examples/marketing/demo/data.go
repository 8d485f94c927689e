package demo

import (
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"time"
)

// campaign is a line of marketing spend with its own economics.
type campaign struct {
	channel, name string
	dailySpend    float64 // mean
	cpm           float64 // cost per thousand impressions
	ctr           float64 // clicks per impression
	cvr           float64 // conversions per click
	aov           float64 // revenue per conversion
}

var campaigns = []campaign{
	{"Google Ads", "Search - Brand", 420, 40, 0.061, 0.082, 74},
	{"Google Ads", "Search - Generic", 760, 60, 0.032, 0.041, 69},
	{"Meta", "Prospecting - Lookalike", 640, 9, 0.011, 0.021, 62},
	{"Meta", "Retargeting - Cart", 260, 14, 0.019, 0.067, 71},
	{"LinkedIn", "B2B - Decision Makers", 380, 31.0, 0.006, 0.028, 240},
	{"TikTok", "Awareness - Creators", 300, 4.1, 0.009, 0.012, 48},
	{"Email", "Newsletter - Weekly", 120, 4, 0.028, 0.051, 66},
	{"Display", "Programmatic - Remarketing", 210, 2.8, 0.004, 0.031, 58},
}

// Columns of the generated data.
var Columns = []string{"date", "channel", "campaign", "spend", "impressions", "clicks", "conversions", "revenue"}

// GenerateCSV writes a year of daily campaign data (2920 rows) as CSV. The
// same seed gives the same file.
func GenerateCSV(w io.Writer, seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	out := csv.NewWriter(w)
	if err := out.Write(Columns); err != nil {
		return err
	}
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for day := range 365 {
		date := start.AddDate(0, 0, day)
		// Busier towards the end of the year, quieter at weekends.
		season := 1 + 0.35*math.Sin(float64(day-80)/365*2*math.Pi) + 0.25*float64(day)/365
		if wd := date.Weekday(); wd == time.Saturday || wd == time.Sunday {
			season *= 0.78
		}
		for _, c := range campaigns {
			noise := func(sd float64) float64 { return math.Max(0.2, 1+rng.NormFloat64()*sd) }
			spend := c.dailySpend * season * noise(0.18)
			impressions := int(spend / c.cpm * 1000 * noise(0.08))
			clicks := int(float64(impressions) * c.ctr * noise(0.12))
			conversions := int(float64(clicks) * c.cvr * noise(0.25))
			revenue := float64(conversions) * c.aov * noise(0.15)
			err := out.Write([]string{
				date.Format("2006-01-02"), c.channel, c.name,
				fmt.Sprintf("%.2f", spend), fmt.Sprint(impressions), fmt.Sprint(clicks),
				fmt.Sprint(conversions), fmt.Sprintf("%.2f", revenue),
			})
			if err != nil {
				return err
			}
		}
	}
	out.Flush()
	return out.Error()
}
