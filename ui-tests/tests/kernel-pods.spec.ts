import { expect, galata, test } from '@jupyterlab/galata';
import { APIRequestContext } from '@playwright/test';

import { PauseHelper } from './helpers';

/**
 * The kernel-pod backend in the browser (playwright-kernel-pods.config.js):
 * JupyterLab stays up while each notebook's GPU kernel is a pod on the real
 * control plane's one node of one GPU. A notebook paused from the toolbar,
 * closed and opened again, and resumed while the GPU is taken shows its place
 * in this server's line,
 * "Waiting for GPU (2nd in line)" (again once closed and opened while it
 * waits), then "Ready" once the GPU comes round to it, with its data back in
 * the same kernel.
 */
test.use({
  mockSettings: {
    ...galata.DEFAULT_SETTINGS,
    'jupyter-pause:plugin': { refreshIntervalSeconds: 1 }
  }
});

const GPU_KERNEL = {
  name: 'python-gpu-pod',
  display_name: 'Python 3 (GPU kernel pod)'
};

/** A session with a GPU kernel pod for `path`, as another tab opens one. */
async function openElsewhere(
  request: APIRequestContext,
  path: string
): Promise<void> {
  const opened = await request.post('/api/sessions', {
    data: {
      path,
      name: path.split('/').pop(),
      type: 'notebook',
      kernel: { name: GPU_KERNEL.name }
    }
  });
  expect(opened.status()).toBe(201);
}

async function post(
  request: APIRequestContext,
  action: string,
  path: string
): Promise<void> {
  const answer = await request.post(`/jupyter-pause/${action}/${path}`, {
    data: {}
  });
  expect(answer.status(), await answer.text()).toBeLessThan(300);
}

/** Poll a notebook's pause state until `check` holds. */
async function until(
  request: APIRequestContext,
  path: string,
  check: (session: any) => boolean,
  timeout = 120 * 1000
): Promise<void> {
  await expect
    .poll(
      async () => {
        const answer = await request.get(`/jupyter-pause/sessions/${path}`);
        return answer.ok() ? check(await answer.json()) : false;
      },
      { timeout, intervals: [500] }
    )
    .toBe(true);
}

test('a resume waits for the GPU in line, then is ready in the same kernel', async ({
  page,
  request,
  tmpPath
}) => {
  const pause = new PauseHelper(page);
  const other = `${tmpPath}/other.ipynb`;
  const trainer = `${tmpPath}/trainer.ipynb`;

  // Given a notebook whose GPU kernel pod built a model, paused from the toolbar
  await pause.openNotebook(
    tmpPath,
    'mine.ipynb',
    'weights = list(range(10))\nprint("built", sum(weights))',
    GPU_KERNEL
  );
  await pause.waitForKernelIdle();
  await page.notebook.runCell(0, { inplace: true });
  expect((await page.notebook.getCellTextOutput(0))?.join('')).toContain(
    'built 45'
  );
  await expect(pause.chipLabel).toHaveText('Active');
  await pause.pause();
  await expect(pause.chipLabel).toHaveText(/^Paused since/, {
    timeout: 120 * 1000
  });
  // closed and opened again while paused (its new connection goes to no pod)
  await page.notebook.close();
  await page.notebook.openByPath(`${tmpPath}/mine.ipynb`);
  await page.notebook.activate('mine.ipynb');
  await expect(pause.chipLabel).toHaveText(/^Paused since/, {
    timeout: 60 * 1000
  });
  // and another paused GPU notebook, and a third one's kernel pod on the GPU
  await openElsewhere(request, other);
  await until(request, other, s => s.state === 'active' && s.watching);
  await post(request, 'pause', other);
  await until(request, other, s => s.state === 'paused');
  await openElsewhere(request, trainer);
  await until(request, trainer, s => s.state === 'active' && s.watching);

  // When the other notebook resumes, then this one from the toolbar
  await post(request, 'resume', other);
  await until(request, other, s => s.queue_position === 1);
  await pause.toggle.click();

  // Then it waits second in line, with the scheduler's reason in the tooltip
  await expect(pause.chipLabel).toHaveText('Waiting for GPU (2nd in line)', {
    timeout: 60 * 1000
  });
  await expect(pause.chip).toHaveAttribute(
    'title',
    /2nd in line; 1 resume on this server gets a GPU first/
  );
  // and closed and opened again while it waits, it still says so
  await page.notebook.close();
  await page.notebook.openByPath(`${tmpPath}/mine.ipynb`);
  await page.notebook.activate('mine.ipynb');
  await expect(pause.chipLabel).toHaveText('Waiting for GPU (2nd in line)', {
    timeout: 60 * 1000
  });

  // When the GPU is freed, goes to the other notebook, and is freed again
  await post(request, 'pause', trainer);
  await until(request, other, s => s.state === 'ready');
  await expect(pause.chipLabel).toHaveText('Waiting for GPU (1st in line)', {
    timeout: 60 * 1000
  });
  await post(request, 'pause', other);

  // Then this notebook is ready, its data back in the kernel it shows
  await expect(pause.chipLabel).toHaveText(
    /^Ready: restored from files \(1 variable\)$/,
    { timeout: 180 * 1000 }
  );
  await pause.waitForKernelIdle();
  await page.notebook.addCell('code', 'print("back", sum(weights))');
  await page.notebook.runCell(1);
  expect((await page.notebook.getCellTextOutput(1))?.join('')).toContain(
    'back 45'
  );
});
