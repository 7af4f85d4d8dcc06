import { TranslationBundle, nullTranslator } from '@jupyterlab/translation';
import { Widget } from '@lumino/widgets';

import { IPolicy, IStatus, ITimeline, errorMessage } from './api';
import { PauseManager } from './model';
import {
  IGpuDay,
  IPauseBar,
  PhaseKind,
  describeEvent,
  gpuDays,
  pauseBars,
  usesGpus
} from './phases';
import { formatBytes, formatDuration, sessionView } from './view';

const SVG_NS = 'http://www.w3.org/2000/svg';
/**
 * How many of the last pauses the Gantt chart shows.
 */
const CHART_PAUSES = 6;
/**
 * How many days the GPU-hours chart shows.
 */
const CHART_DAYS = 21;

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
    const gpu = usesGpus(timeline.events);
    const summary = element('dl', 'jp-JupyterPause-TimelineSummary');
    const latency = (value: number | null) =>
      value === null ? '-' : duration(value);
    const facts: [string, string][] = [
      [trans.__('State'), timeline.state],
      [trans.__('Pauses / resumes'), `${acc.pauses} / ${acc.resumes}`],
      ...(gpu
        ? ([
            [
              trans.__('GPU time allocated'),
              duration(acc.gpu_seconds_allocated)
            ],
            [trans.__('GPU time active'), duration(acc.gpu_seconds_active)],
            [trans.__('GPU time released'), duration(acc.gpu_seconds_released)]
          ] as [string, string][])
        : [
            [trans.__('GPU'), trans.__('none (CPU-only session)')] as [
              string,
              string
            ]
          ]),
      [
        trans.__('Last resume to ready'),
        latency(acc.last_resume_to_ready_seconds)
      ],
      [
        trans.__('Last resume to next cell'),
        latency(acc.last_resume_to_next_cell_seconds)
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
    const bars = pauseBars(timeline.events, now).slice(-CHART_PAUSES);
    const chart = element('section', 'jp-JupyterPause-TimelineChart');
    chart.append(
      element(
        'h3',
        '',
        bars.length
          ? trans._n('The last pause', 'The last %1 pauses', bars.length)
          : trans.__('No pause yet')
      )
    );
    if (bars.length) {
      chart.append(ganttChart(bars, trans));
    }
    if (gpu) {
      chart.append(
        element(
          'h3',
          '',
          trans.__('GPU hours per day, last %1 days', CHART_DAYS)
        )
      );
      chart.append(
        dayChart(gpuDays(timeline.events, now, null, CHART_DAYS), trans)
      );
    }

    const list = element('ol', 'jp-JupyterPause-TimelineEvents');
    const when = new Intl.DateTimeFormat(undefined, {
      month: 'short',
      day: 'numeric',
      hour: '2-digit',
      minute: '2-digit',
      second: '2-digit'
    });
    for (const event of [...timeline.events].reverse()) {
      const item = element('li', '');
      item.append(
        element(
          'time',
          'jp-JupyterPause-TimelineWhen',
          when.format(new Date(event.at * 1000))
        ),
        element('span', 'jp-JupyterPause-TimelineKind', describeEvent(event))
      );
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
  // Scales down with a narrow panel (split beside the notebook), never up.
  return svg('svg', {
    class: 'jp-JupyterPause-Chart',
    width: '100%',
    style: `max-width: ${width}px`,
    viewBox: `0 0 ${width} ${height}`,
    role: 'img',
    'aria-label': label
  });
}

/**
 * Colours (CSS classes) and legends of the Gantt phases, in their order.
 */
function phaseLegend(trans: TranslationBundle): [PhaseKind, string][] {
  return [
    ['active', trans.__('active work')],
    ['idle', trans.__('idle, GPU held')],
    ['checkpointing', trans.__('checkpointing')],
    ['released', trans.__('stopped, GPU released')],
    ['waiting', trans.__('waiting for resources')],
    ['restoring', trans.__('restoring')],
    ['ready', trans.__('ready, until the first cell')]
  ];
}

/**
 * Each pause as a row of its phases on its own time axis (from the start of
 * its active work to the first cell after the resume); phases too short to
 * see get a few pixels, and every phase has a tooltip with its duration.
 */
function ganttChart(bars: IPauseBar[], trans: TranslationBundle): SVGElement {
  const labelWidth = 70;
  const width = 560;
  const plot = width - labelWidth - 10;
  const rowHeight = 34;
  const legend = phaseLegend(trans);
  const legendRows = Math.ceil(legend.length / 3);
  const height = bars.length * rowHeight + legendRows * 18 + 6;
  const root = chart(
    width,
    height,
    trans.__('Phases of each pause, from active work to the first cell')
  );
  const names = new Map(legend);
  bars.forEach((bar, i) => {
    const top = i * rowHeight;
    const start = bar.phases[0].start;
    const end = bar.phases[bar.phases.length - 1].end;
    const span = Math.max(1, end - start);
    root.append(
      svg(
        'text',
        { x: 0, y: top + 14, class: 'jp-JupyterPause-ChartLabel' },
        trans.__('Pause %1', bar.index)
      )
    );
    let x = labelWidth;
    for (const phase of bar.phases) {
      const seconds = phase.end - phase.start;
      const w = Math.max(3, (seconds / span) * plot);
      const rect = svg('rect', {
        x,
        y: top + 4,
        width: w,
        height: 14,
        class: `jp-JupyterPause-Phase jp-JupyterPause-Phase-${phase.kind}`
      });
      rect.append(
        svg(
          'title',
          {},
          trans.__(
            '%1: %2',
            names.get(phase.kind),
            formatDuration(seconds, trans)
          )
        )
      );
      root.append(rect);
      x += w;
    }
    root.append(
      svg(
        'text',
        { x: labelWidth, y: top + 30, class: 'jp-JupyterPause-ChartValue' },
        trans.__(
          '%1, %2 in all',
          new Date(start * 1000).toLocaleString(),
          formatDuration(span, trans)
        )
      )
    );
  });
  legend.forEach(([kind, label], j) => {
    const x = labelWidth + (j % 3) * 165;
    const y = bars.length * rowHeight + Math.floor(j / 3) * 18 + 12;
    root.append(
      svg('rect', {
        x,
        y: y - 9,
        width: 10,
        height: 10,
        class: `jp-JupyterPause-Phase jp-JupyterPause-Phase-${kind}`
      }),
      svg('text', { x: x + 14, y, class: 'jp-JupyterPause-ChartLabel' }, label)
    );
  });
  return root;
}

/**
 * GPU hours allocated (light) and active (dark) per day, the oldest left.
 */
function dayChart(days: IGpuDay[], trans: TranslationBundle): SVGElement {
  const width = 560;
  const height = 120;
  const left = 34;
  const plotHeight = 80;
  const step = (width - left) / Math.max(1, days.length);
  const max = Math.max(1, ...days.map(d => d.allocatedHours));
  const root = chart(
    width,
    height,
    trans.__('GPU hours allocated and active per day')
  );
  root.append(
    svg(
      'text',
      { x: 0, y: 10, class: 'jp-JupyterPause-ChartValue' },
      trans.__('%1 h', max.toFixed(max < 10 ? 1 : 0))
    ),
    svg(
      'text',
      { x: 0, y: plotHeight, class: 'jp-JupyterPause-ChartValue' },
      '0'
    )
  );
  days.forEach((day, i) => {
    const x = left + i * step;
    const date = new Date(day.day * 1000);
    for (const [hours, className] of [
      [day.allocatedHours, 'jp-JupyterPause-BarAllocated'],
      [day.activeHours, 'jp-JupyterPause-BarActive']
    ] as [number, string][]) {
      const h = (hours / max) * plotHeight;
      const rect = svg('rect', {
        x: x + 1,
        y: plotHeight - h,
        width: Math.max(1, step - 3),
        height: h,
        class: className
      });
      rect.append(
        svg(
          'title',
          {},
          trans.__(
            '%1: %2 GPU h allocated, %3 active',
            date.toLocaleDateString(),
            day.allocatedHours.toFixed(1),
            day.activeHours.toFixed(1)
          )
        )
      );
      root.append(rect);
    }
    if (i % 7 === days.length % 7 || i === days.length - 1) {
      root.append(
        svg(
          'text',
          { x, y: plotHeight + 14, class: 'jp-JupyterPause-ChartValue' },
          `${date.getMonth() + 1}/${date.getDate()}`
        )
      );
    }
  });
  root.append(
    svg('rect', {
      x: left,
      y: height - 18,
      width: 10,
      height: 10,
      class: 'jp-JupyterPause-BarAllocated'
    }),
    svg(
      'text',
      { x: left + 14, y: height - 9, class: 'jp-JupyterPause-ChartLabel' },
      trans.__('allocated')
    ),
    svg('rect', {
      x: left + 100,
      y: height - 18,
      width: 10,
      height: 10,
      class: 'jp-JupyterPause-BarActive'
    }),
    svg(
      'text',
      { x: left + 114, y: height - 9, class: 'jp-JupyterPause-ChartLabel' },
      trans.__('active')
    )
  );
  return root;
}
