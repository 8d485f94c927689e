// Package demo is the marketing analysis demo: what a model does with a
// code interpreter, through the official MCP Go SDK client. It uploads a
// year of campaign data, analyses it with pandas (its first attempt uses a
// wrong column name and fails, and the next call fixes it, as a model
// would), draws seaborn charts, builds a multi-page PDF report with
// reportlab, looks at a chart, and downloads the report.
package demo

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Step is one tool call of the demo and what came of it.
type Step struct {
	Name    string
	Success bool
	Stdout  string
	Stderr  string
}

// Report is what the demo produced.
type Report struct {
	ConversationID string
	Steps          []Step
	Charts         []string // names of the chart files
	Chart          []byte   // a chart as read_file returned it (PNG)
	ChartMIME      string
	PDF            []byte // the downloaded report
	PDFURL         string
}

// The analysis, as a model would write it. The first version asks for a
// "revenu" column that does not exist.
const (
	analysisWrong = `
import pandas as pd
df = pd.read_csv('marketing.csv', parse_dates=['date'])
by_channel = df.groupby('channel')[['spend', 'revenu']].sum()
print(by_channel)
`
	analysis = `
import pandas as pd
df = pd.read_csv('marketing.csv', parse_dates=['date'])
by_channel = df.groupby('channel')[['spend', 'impressions', 'clicks', 'conversions', 'revenue']].sum()
by_channel['ctr_pct'] = 100 * by_channel['clicks'] / by_channel['impressions']
by_channel['cpa'] = by_channel['spend'] / by_channel['conversions']
by_channel['roas'] = by_channel['revenue'] / by_channel['spend']
by_channel = by_channel.sort_values('roas', ascending=False).round(2)
by_channel.to_csv('summary_by_channel.csv')
print(f"{len(df)} rows, {df['date'].min():%Y-%m-%d} to {df['date'].max():%Y-%m-%d}")
print(f"total spend {df['spend'].sum():,.0f}, revenue {df['revenue'].sum():,.0f}, ROAS {df['revenue'].sum() / df['spend'].sum():.2f}")
print(by_channel[['spend', 'revenue', 'roas']].to_string())
`
	charts = `
import pandas as pd, seaborn as sns, matplotlib.pyplot as plt
sns.set_theme(style='whitegrid')
df = pd.read_csv('marketing.csv', parse_dates=['date'])

by_channel = df.groupby('channel')[['spend', 'revenue']].sum().reset_index()
by_channel['roas'] = by_channel['revenue'] / by_channel['spend']
fig, ax = plt.subplots(figsize=(8, 4.5))
sns.barplot(data=by_channel.sort_values('roas', ascending=False), x='channel', y='roas', ax=ax, color='#4C72B0')
ax.set(title='Return on ad spend by channel', xlabel='', ylabel='revenue / spend')
fig.tight_layout(); fig.savefig('chart_roas_by_channel.png', dpi=110); plt.close(fig)

weekly = df.set_index('date').resample('W')[['spend', 'revenue']].sum().reset_index()
fig, ax = plt.subplots(figsize=(8, 4.5))
sns.lineplot(data=weekly.melt('date', var_name='metric', value_name='amount'), x='date', y='amount', hue='metric', ax=ax)
ax.set(title='Weekly spend and revenue', xlabel='', ylabel='')
fig.tight_layout(); fig.savefig('chart_weekly_trend.png', dpi=110); plt.close(fig)

camp = df.groupby('campaign')[['clicks', 'conversions']].sum()
camp['cvr_pct'] = 100 * camp['conversions'] / camp['clicks']
fig, ax = plt.subplots(figsize=(8, 4.5))
sns.barplot(x=camp['cvr_pct'].sort_values(), y=camp['cvr_pct'].sort_values().index, ax=ax, color='#55A868')
ax.set(title='Conversion rate by campaign (%)', xlabel='', ylabel='')
fig.tight_layout(); fig.savefig('chart_cvr_by_campaign.png', dpi=110); plt.close(fig)
print('charts written')
`
	pdf = `
import pandas as pd
from reportlab.lib import colors
from reportlab.lib.pagesizes import A4
from reportlab.lib.styles import getSampleStyleSheet
from reportlab.lib.units import cm
from reportlab.platypus import SimpleDocTemplate, Paragraph, Spacer, Table, TableStyle, Image, PageBreak

styles = getSampleStyleSheet()
summary = pd.read_csv('summary_by_channel.csv')
doc = SimpleDocTemplate('report.pdf', pagesize=A4, title='Marketing performance 2025')
story = [Paragraph('Marketing performance 2025', styles['Title']),
         Paragraph('Spend, revenue and return on ad spend by channel, from a year of daily campaign data.', styles['Normal']),
         Spacer(1, 0.6 * cm)]
cols = ['channel', 'spend', 'revenue', 'conversions', 'cpa', 'roas']
rows = [cols] + [[r['channel']] + [f"{r[c]:,.2f}" for c in cols[1:]] for _, r in summary.iterrows()]
table = Table(rows, hAlign='LEFT')
table.setStyle(TableStyle([('BACKGROUND', (0, 0), (-1, 0), colors.HexColor('#4C72B0')),
                           ('TEXTCOLOR', (0, 0), (-1, 0), colors.white),
                           ('GRID', (0, 0), (-1, -1), 0.25, colors.grey),
                           ('ALIGN', (1, 1), (-1, -1), 'RIGHT')]))
story += [table, PageBreak()]
for name, title in [('chart_roas_by_channel.png', 'Return on ad spend'),
                    ('chart_weekly_trend.png', 'Weekly trend'),
                    ('chart_cvr_by_campaign.png', 'Conversion rate')]:
    story += [Paragraph(title, styles['Heading2']), Image(name, width=16 * cm, height=9 * cm), Spacer(1, 0.5 * cm)]
doc.build(story)
print('report.pdf written')
`
)

// Run plays the demo on cs. httpClient downloads files (their URLs need no
// token). logf, if not nil, narrates.
func Run(ctx context.Context, cs *mcp.ClientSession, csv []byte, httpClient *http.Client, logf func(string, ...any)) (*Report, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	rep := &Report{}

	// 1. Upload the data.
	if err := upload(ctx, cs, csv, rep, logf); err != nil {
		return nil, err
	}
	// 2. The analysis: wrong first, then fixed.
	if err := analyse(ctx, cs, rep, logf); err != nil {
		return rep, err
	}
	// 3. What is there now; look at a chart; download the report.
	if err := findOutputs(ctx, cs, rep); err != nil {
		return rep, err
	}
	if err := lookAtChart(ctx, cs, rep, logf); err != nil {
		return rep, err
	}
	if err := downloadReport(httpClient, rep, logf); err != nil {
		return rep, err
	}
	return rep, nil
}

// upload uploads the data, in a new conversation (rep's).
func upload(ctx context.Context, cs *mcp.ClientSession, csv []byte, rep *Report, logf func(string, ...any)) error {
	var up struct {
		ConversationID string `json:"conversationId"`
		Name           string `json:"name"`
		SizeBytes      int64  `json:"size_bytes"`
	}
	if err := callTool(ctx, cs, "upload_file", map[string]any{
		"filename": "marketing.csv", "content_base64": base64.StdEncoding.EncodeToString(csv),
	}, &up); err != nil {
		return err
	}
	rep.ConversationID = up.ConversationID
	logf("uploaded %s (%d bytes) to conversation %s", up.Name, up.SizeBytes, up.ConversationID)
	return nil
}

// analyse runs the analysis (its first attempt fails), the charts and the
// report, each a step of rep.
func analyse(ctx context.Context, cs *mcp.ClientSession, rep *Report, logf func(string, ...any)) error {
	for _, s := range []struct{ name, code string }{
		{"analysis (first attempt)", analysisWrong},
		{"analysis", analysis},
		{"charts", charts},
		{"pdf report", pdf},
	} {
		var r struct {
			Success bool   `json:"success"`
			Stdout  string `json:"stdout"`
			Stderr  string `json:"stderr"`
		}
		if err := callTool(ctx, cs, "run_code", map[string]any{
			"language": "python", "conversationId": rep.ConversationID, "code": s.code,
		}, &r); err != nil {
			return err
		}
		rep.Steps = append(rep.Steps, Step{Name: s.name, Success: r.Success, Stdout: r.Stdout, Stderr: r.Stderr})
		if r.Success {
			logf("%s: ok\n%s", s.name, strings.TrimSpace(r.Stdout))
		} else {
			logf("%s: failed: %s", s.name, lastLine(r.Stderr))
			if s.name != "analysis (first attempt)" {
				return fmt.Errorf("%s failed: %s", s.name, lastLine(r.Stderr))
			}
		}
	}
	return nil
}

// findOutputs lists the conversation's files: the charts and the report's
// URL.
func findOutputs(ctx context.Context, cs *mcp.ClientSession, rep *Report) error {
	var list struct {
		Files []struct {
			Name     string `json:"name"`
			MimeType string `json:"mime_type"`
			URL      string `json:"url"`
		} `json:"files"`
	}
	if err := callTool(ctx, cs, "list_files", map[string]any{"conversationId": rep.ConversationID}, &list); err != nil {
		return err
	}
	for _, f := range list.Files {
		if strings.HasPrefix(f.Name, "chart_") {
			rep.Charts = append(rep.Charts, f.Name)
		}
		if f.Name == "report.pdf" {
			rep.PDFURL = f.URL
		}
	}
	if len(rep.Charts) == 0 || rep.PDFURL == "" {
		return fmt.Errorf("the charts or the report are missing: %+v", list.Files)
	}
	return nil
}

// lookAtChart reads the first chart as a model sees it: an image.
func lookAtChart(ctx context.Context, cs *mcp.ClientSession, rep *Report, logf func(string, ...any)) error {
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "read_file", Arguments: map[string]any{
		"conversationId": rep.ConversationID, "name": rep.Charts[0]}})
	if err != nil {
		return err
	}
	for _, c := range res.Content {
		if img, ok := c.(*mcp.ImageContent); ok {
			rep.Chart, rep.ChartMIME = img.Data, img.MIMEType
		}
	}
	if rep.Chart == nil {
		return fmt.Errorf("read_file of %s returned no image", rep.Charts[0])
	}
	logf("looked at %s: %s, %d bytes", rep.Charts[0], rep.ChartMIME, len(rep.Chart))
	return nil
}

// downloadReport downloads the report from its URL.
func downloadReport(httpClient *http.Client, rep *Report, logf func(string, ...any)) error {
	resp, err := httpClient.Get(rep.PDFURL)
	if err != nil {
		return fmt.Errorf("download the report: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("download the report: %s", resp.Status)
	}
	if rep.PDF, err = io.ReadAll(resp.Body); err != nil {
		return fmt.Errorf("download the report: %w", err)
	}
	logf("downloaded report.pdf: %d bytes, %d pages, %d images", len(rep.PDF), PDFPages(rep.PDF), PDFImages(rep.PDF))
	return nil
}

var (
	pagePattern  = regexp.MustCompile(`/Type\s*/Page\b[^s]`)
	imagePattern = regexp.MustCompile(`/Subtype\s*/Image\b`)
)

// PDFPages counts the pages of a PDF (its page objects).
func PDFPages(pdf []byte) int { return len(pagePattern.FindAll(pdf, -1)) }

// PDFImages counts the image objects of a PDF.
func PDFImages(pdf []byte) int { return len(imagePattern.FindAll(pdf, -1)) }

// callTool calls a tool and decodes its structured result; a tool error
// is an error.
func callTool(ctx context.Context, cs *mcp.ClientSession, name string, args map[string]any, out any) error {
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if res.IsError {
		return fmt.Errorf("%s: %s", name, b)
	}
	return json.Unmarshal(b, out)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
