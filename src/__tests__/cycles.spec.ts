import { ITimelineEvent } from '../api';
import { cycles, eventLabel } from '../cycles';

function ev(kind: string, at: number, data = {}): ITimelineEvent {
  return { kind, at, data };
}

describe('cycles', () => {
  it('splits a timeline into pause/resume cycles', () => {
    const events = [
      ev('gpu_acquired', 0),
      ev('last_activity', 600),
      ev('pause_requested', 1000),
      ev('checkpoint_written', 1005, { bytes_written: 10 }),
      ev('kernel_stopped', 1010),
      ev('gpu_released', 1010),
      ev('resume_requested', 5000),
      ev('resources_acquired', 5002),
      ev('state_restored', 5008),
      ev('kernel_ready', 5010),
      ev('first_cell_executed', 5030),
      ev('last_activity', 5100),
      ev('pause_requested', 6000),
      ev('gpu_released', 6010)
    ];
    const rows = cycles(events, 7010);
    expect(rows).toHaveLength(2);
    expect(rows[0]).toEqual({
      index: 1,
      pausedAt: 1000,
      allocatedSeconds: 1010,
      activeSeconds: 600,
      releasedSeconds: 3992,
      resumeToReadySeconds: 10,
      resumeToNextCellSeconds: 30
    });
    expect(rows[1]).toMatchObject({
      index: 2,
      allocatedSeconds: 1008,
      activeSeconds: 98,
      releasedSeconds: 1000,
      resumeToNextCellSeconds: null
    });
  });

  it('is empty without pauses', () => {
    expect(cycles([ev('gpu_acquired', 0)], 10)).toEqual([]);
  });
});

describe('eventLabel', () => {
  it('reads like words', () => {
    expect(eventLabel('gpu_released')).toBe('GPU released');
    expect(eventLabel('first_cell_executed')).toBe('First cell executed');
  });
});
