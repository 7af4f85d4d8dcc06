// Renders the ```mermaid blocks of the manual (architecture.md) with mermaid from a CDN;
// without network the block stays readable as text.
(function () {
  const blocks = document.querySelectorAll('pre > code.language-mermaid');
  if (blocks.length === 0) {
    return;
  }
  blocks.forEach(code => {
    const div = document.createElement('div');
    div.className = 'mermaid';
    div.textContent = code.textContent;
    code.parentElement.replaceWith(div);
  });
  const script = document.createElement('script');
  script.src = 'https://cdn.jsdelivr.net/npm/mermaid@11/dist/mermaid.min.js';
  script.onload = () => window.mermaid.run();
  document.head.appendChild(script);
})();
