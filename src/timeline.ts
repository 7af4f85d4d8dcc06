import { TranslationBundle, nullTranslator } from '@jupyterlab/translation';
import { Widget } from '@lumino/widgets';

import { IPolicy, IStatus, ITimeline, errorMessage } from './api';
import { ICycle, cycles, eventLabel } from './cycles';
import { PauseManager } from './model';
import { formatBytes, formatDuration, sessionView } from './view';

const SVG_NS = 'http://www.w3.org/2000/svg';
/**
 * How many of the last pauses the chart shows.
 */
const CHART_CYCLES = 6;

function svg(
  tag: string,
  attributes: Record<string, string | number>,
  text?: string
): SVGElement {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attributes)) {
    node.setAttribute(name, String(value));
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

function element(tag: string, className: string, text?: string): HTMLElement {
  const node = document.createElement(tag);
  node.className = className;
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

/**
 * The admin's effective policy as label/value rows (read-only).
 *
 * @param status The server status.
 * @param trans The translation bundle.
 * @returns Rows to show.
 */
export function policyRows(
  status: IStatus,
  trans: TranslationBundle = nullTranslator.load('jupyter_pause')
): [string, string][] {
  const policy: Partial<IPolicy> = status.policy || {};
  const resources = status.resources;
  const idle = policy.idle_pause_minutes || 0;
  const retention = [
    trans.__('keep the last %1', policy.keep_last ?? '?'),
    policy.max_age_hours
      ? trans.__('at most %1 h old', policy.max_age_hours)
      : '',
    policy.max_bytes
      ? trans.__('at most %1', formatBytes(policy.max_bytes))
      : ''
  ]
    .filter(Boolean)
    .join(', ');
  const rows: [string, string][] = [
    [
      trans.__('Backend'),
      trans.__('%1 (jupyter_pause %2)', status.backend, status.version)
    ],
    [
      trans.__('Idle pause'),
      idle > 0
        ? trans.__('after %1 min without activity', idle)
        : trans.__('off (manual only)')
    ],
    [
      trans.__('Minimum running time'),
      trans.__(
        '%1 min before an automatic pause',
        policy.min_running_minutes ?? 0
      )
    ],
    [
      trans.__('Busy kernel wait'),
      trans.__('%1 s', policy.busy_wait_seconds ?? 0)
    ],
    [trans.__('Checkpoint retention'), retention],
    [
      trans.__('Variables not marked'),
      `${policy.save_unmarked ?? trans.__('all')}`
    ],
    [trans.__('GPUs per kernel'), `${policy.gpus_per_kernel ?? 0}`]
  ];
  if (resources) {
    rows.push([
      trans.__('GPUs'),
      resources.queue.length
        ? trans.__(
            '%1 free of %2; %3 waiting',
            resources.gpus_free,
            resources.gpus_total,
            resources.queue.length
          )
        : trans.__('%1 free of %2', resources.gpus_free, resources.gpus_total)
    ]);
  }
  return rows;
}

/**
 * The timeline panel of one notebook: its GPU accounting as a chart, the
 * admin's policy (read-only) and the event list.
 */
export class TimelinePanel extends Widget {
  /**
   * Create the panel.
   *
   * @param manager The shared manager.
   * @param path The notebook path relative to the server root.
   */
  constructor(
    private _manager: PauseManager,
    readonly path: string
  ) {
    super();
    const trans = this._manager.trans;
    this.addClass('jp-JupyterPause-Timeline');
    this.title.label = trans.__('Pause timeline: %1', path.split('/').pop());
    this.title.caption = trans.__(
      'GPU time and pause/resume events of %1',
      path
    );
    this.title.closable = true;
  }

  /**
   * Fetch the timeline and the policy, then render them.
   */
  async refresh(): Promise<void> {
    try {
      const [timeline, status] = await Promise.all([
        this._manager.client.getTimeline(this.path),
        this._manager.client.getStatus()
      ]);
      this._render(timeline, status);
    } catch (error) {
      this.node.replaceChildren(
        element(
          'p',
          'jp-JupyterPause-TimelineError',
          this._manager.trans.__(
            'No timeline for %1: %2',
            this.path,
            errorMessage(error)
          )
        )
      );
    }
  }

  private _render(timeline: ITimeline, status: IStatus | null): void {
    const trans = this._manager.trans;
    const duration = (seconds: number) => formatDuration(seconds, trans);
    const header = element('header', 'jp-JupyterPause-TimelineHeader');
    header.append(element('h2', '', this.path));
    const refresh = element('button', 'jp-JupyterPause-TimelineRefresh');
    refresh.textContent = trans.__('Refresh');
    refresh.setAttribute('type', 'button');
    refresh.addEventListener('click', () => void this.refresh());
    header.append(refresh);

    const acc = timeline.accounting;
    const summary = element('dl', 'jp-JupyterPause-TimelineSummary');
    const facts: [string, string][] = [
      [trans.__('State'), timeline.state],
      [trans.__('Pauses / resumes'), `${acc.pauses} / ${acc.resumes}`],
      [trans.__('GPU time allocated'), duration(acc.gpu_seconds_allocated)],
      [trans.__('GPU time active'), duration(acc.gpu_seconds_active)],
      [trans.__('GPU time released'), duration(acc.gpu_seconds_released)],
      [
        trans.__('Last resume to ready'),
        acc.last_resume_to_ready_seconds === null
          ? '-'
          : duration(acc.last_resume_to_ready_seconds)
      ],
      [
        trans.__('Last resume to next cell'),
        acc.last_resume_to_next_cell_seconds === null
          ? '-'
          : duration(acc.last_resume_to_next_cell_seconds)
      ],
      [trans.__('Bytes saved'), formatBytes(acc.bytes_saved)]
    ];
    if (acc.snapshots) {
      facts.push([trans.__('Pod snapshots'), String(acc.snapshots)]);
    }
    for (const [term, value] of facts) {
      summary.append(element('dt', '', term), element('dd', '', value));
    }

    const policy = element('section', 'jp-JupyterPause-TimelinePolicy');
    policy.append(element('h3', '', trans.__('Admin policy (read-only)')));
    if (status) {
      const table = element('dl', 'jp-JupyterPause-TimelineSummary');
      for (const [term, value] of policyRows(status, trans)) {
        table.append(element('dt', '', term), element('dd', '', value));
      }
      policy.append(table);
    } else {
      policy.append(
        element('p', '', sessionView(null, this._manager.server, trans).tooltip)
      );
    }

    const now = Date.now() / 1000;
    const all = cycles(timeline.events, now);
    const last = all.slice(-CHART_CYCLES);
    const chart = element('section', 'jp-JupyterPause-TimelineChart');
    chart.append(
      element(
        'h3',
        '',
        trans._n(
          'Last pause: GPU time',
          'Last %1 pauses: GPU time',
          last.length
        )
      )
    );
    chart.append(gpuChart(last, Math.max(1, acc.gpus), trans));
    chart.append(element('h3', '', trans.__('Resume to next cell')));
    chart.append(latencyChart(last, trans));

    const list = element('ol', 'jp-JupyterPause-TimelineEvents');
    for (const event of [...timeline.events].reverse()) {
      const item = element('li', '');
      const when = new Date(event.at * 1000).toLocaleString();
      item.append(
        element('time', 'jp-JupyterPause-TimelineWhen', when),
        element('span', 'jp-JupyterPause-TimelineKind', eventLabel(event.kind))
      );
      const details = Object.entries(event.data || {})
        .map(
          ([k, v]) => `${k}: ${typeof v === 'object' ? JSON.stringify(v) : v}`
        )
        .join(', ');
      if (details) {
        item.append(element('span', 'jp-JupyterPause-TimelineData', details));
      }
      list.append(item);
    }
    const events = element('section', 'jp-JupyterPause-TimelineList');
    events.append(
      element('h3', '', trans.__('Events (%1)', timeline.events.length)),
      list
    );

    this.node.replaceChildren(header, summary, chart, policy, events);
  }
}

/** An empty chart of the given size, described for screen readers by ``label``. */
function chart(width: number, height: number, label: string): SVGElement {
  return svg('svg', {
    class: 'jp-JupyterPause-Chart',
    width,
    height,
    viewBox: `0 0 ${width} ${height}`,
    role: 'img',
    'aria-label': label
  });
}

/**
 * The series of the GPU chart: one bar each per pause.
 */
function gpuSeries(
  trans: TranslationBundle
): { key: keyof ICycle; label: string; legend: string; className: string }[] {
  return [
    {
      key: 'allocatedSeconds',
      label: trans.__('allocated'),
      legend: trans.__('GPU allocated'),
      className: 'jp-JupyterPause-BarAllocated'
    },
    {
      key: 'activeSeconds',
      label: trans.__('active'),
      legend: trans.__('GPU active'),
      className: 'jp-JupyterPause-BarActive'
    },
    {
      key: 'releasedSeconds',
      label: trans.__('released'),
      legend: trans.__('GPU released'),
      className: 'jp-JupyterPause-BarReleased'
    }
  ];
}

/**
 * Grouped horizontal bars: allocated, active and released GPU time per pause.
 */
function gpuChart(
  rows: ICycle[],
  gpus: number,
  trans: TranslationBundle
): SVGElement {
  const bars = gpuSeries(trans);
  const barHeight = 10;
  const groupHeight = barHeight * bars.length + 12;
  const labelWidth = 80;
  const width = 520;
  const plot = width - labelWidth - 90;
  const height = Math.max(1, rows.length) * groupHeight + 24;
  const root = chart(
    width,
    height,
    trans.__('GPU time allocated, active and released per pause')
  );
  const max = Math.max(
    1,
    ...rows.flatMap(row => bars.map(s => (row[s.key] as number) * gpus))
  );
  rows.forEach((row, i) => {
    const top = i * groupHeight;
    root.append(
      svg(
        'text',
        { x: 0, y: top + groupHeight / 2, class: 'jp-JupyterPause-ChartLabel' },
        trans.__('Pause %1', row.index)
      )
    );
    bars.forEach((series, j) => {
      const value = (row[series.key] as number) * gpus;
      const y = top + j * barHeight;
      const rect = svg('rect', {
        x: labelWidth,
        y,
        width: Math.max(1, (value / max) * plot),
        height: barHeight - 2,
        class: series.className
      });
      rect.append(
        svg(
          'title',
          {},
          trans.__('%1: %2', series.label, formatDuration(value, trans))
        )
      );
      root.append(
        rect,
        svg(
          'text',
          {
            x: labelWidth + Math.max(1, (value / max) * plot) + 4,
            y: y + barHeight - 3,
            class: 'jp-JupyterPause-ChartValue'
          },
          formatDuration(value, trans)
        )
      );
    });
  });
  const legendY = height - 6;
  bars.forEach((series, j) => {
    const x = labelWidth + j * 110;
    root.append(
      svg('rect', {
        x,
        y: legendY - 9,
        width: 10,
        height: 10,
        class: series.className
      }),
      svg(
        'text',
        { x: x + 14, y: legendY, class: 'jp-JupyterPause-ChartLabel' },
        series.legend
      )
    );
  });
  return root;
}

/**
 * Horizontal bars: seconds from each resume request to the next cell run.
 */
function latencyChart(rows: ICycle[], trans: TranslationBundle): SVGElement {
  const barHeight = 14;
  const labelWidth = 80;
  const width = 520;
  const plot = width - labelWidth - 90;
  const height = Math.max(1, rows.length) * (barHeight + 4) + 4;
  const root = chart(
    width,
    height,
    trans.__('Seconds from each resume to the next cell run')
  );
  const max = Math.max(1, ...rows.map(row => row.resumeToNextCellSeconds ?? 0));
  rows.forEach((row, i) => {
    const y = i * (barHeight + 4);
    const value = row.resumeToNextCellSeconds;
    root.append(
      svg(
        'text',
        { x: 0, y: y + barHeight - 3, class: 'jp-JupyterPause-ChartLabel' },
        trans.__('Pause %1', row.index)
      )
    );
    const w = value === null ? 0 : Math.max(1, (value / max) * plot);
    if (value !== null) {
      root.append(
        svg('rect', {
          x: labelWidth,
          y,
          width: w,
          height: barHeight,
          class: 'jp-JupyterPause-BarLatency'
        })
      );
    }
    root.append(
      svg(
        'text',
        {
          x: labelWidth + w + 4,
          y: y + barHeight - 3,
          class: 'jp-JupyterPause-ChartValue'
        },
        value === null
          ? trans.__('no cell run yet')
          : formatDuration(value, trans)
      )
    );
  });
  return root;
}
