import { LabIcon } from '@jupyterlab/ui-components';

const PAUSE_SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <rect x="5" y="4" width="5" height="16" rx="1"/>
    <rect x="14" y="4" width="5" height="16" rx="1"/>
  </g>
</svg>`;

const RESUME_SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M6 4.5v15a1 1 0 0 0 1.5.86l12.5-7.5a1 1 0 0 0 0-1.72L7.5 3.64A1 1 0 0 0 6 4.5z"/>
  </g>
</svg>`;

const TIMELINE_SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <rect x="3" y="13" width="4" height="8"/>
    <rect x="10" y="8" width="4" height="13"/>
    <rect x="17" y="3" width="4" height="18"/>
  </g>
</svg>`;

/**
 * Icon of the pause command.
 */
export const pauseIcon = new LabIcon({
  name: 'jupyter-pause:pause',
  svgstr: PAUSE_SVG
});

/**
 * Icon of the resume command.
 */
export const resumeIcon = new LabIcon({
  name: 'jupyter-pause:resume',
  svgstr: RESUME_SVG
});

/**
 * Icon of the timeline panel.
 */
export const timelineIcon = new LabIcon({
  name: 'jupyter-pause:timeline',
  svgstr: TIMELINE_SVG
});
