"""What the book's chapters use: their setup (:func:`~ccu.book.chapter.setup_chapter`), the
numbers behind their prose, the figures they draw and the equation index."""
